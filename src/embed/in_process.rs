//! The in-process provider: the `mnemosyne-model` crate's encoder on
//! blocking threads (a passage batch at the lowest CPU priority, so that
//! requests take the cores first; a query at the normal one).

use std::path::Path;
use std::sync::Arc;

use mnemosyne_model::{Cross, Encoder, Kind};

use super::{Earlier, EmbedError, Embedded, ModelKind, Provider};

pub(super) struct InProcess {
    encoder: Arc<Encoder>,
}

impl InProcess {
    pub(super) fn load(model: &Path, cross: Option<&Path>) -> anyhow::Result<InProcess> {
        let mut encoder = Encoder::shared(model)?;
        if let Some(dir) = cross {
            let cross = Cross::shared(dir).map_err(|e| anyhow::anyhow!("the cross-language model: {e:#}"))?;
            encoder = Arc::new(encoder.with_cross(cross));
        }
        Ok(InProcess { encoder })
    }

    /// `f` of the encoder on a blocking thread. The model's errors are
    /// about the text (it reads nothing else once loaded): `Refused`.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Encoder) -> anyhow::Result<T> + Send + 'static,
    ) -> Result<T, EmbedError> {
        let encoder = self.encoder.clone();
        match tokio::task::spawn_blocking(move || f(&encoder)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(EmbedError::Refused(format!("{e:#}"))),
            Err(e) => Err(EmbedError::Refused(format!("the embedding thread failed: {e}"))),
        }
    }
}

#[async_trait::async_trait]
impl Provider for InProcess {
    fn id(&self) -> &str {
        self.encoder.id()
    }

    fn dim(&self) -> usize {
        self.encoder.dim()
    }

    fn model_dim(&self) -> usize {
        mnemosyne_model::DIM
    }

    fn kind(&self) -> ModelKind {
        match self.encoder.kind() {
            Kind::MiniLm => ModelKind::MiniLm,
            Kind::E5 => ModelKind::E5,
        }
    }

    fn is_paired(&self) -> bool {
        self.encoder.is_paired()
    }

    async fn embed_passages(&self, texts: Vec<String>, earlier: Vec<Option<Earlier>>) -> Result<Embedded, EmbedError> {
        self.blocking(move |e| {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let earlier: Vec<Option<(&str, &[f32])>> = earlier
                .iter()
                .map(|e| e.as_ref().map(|e| (e.model.as_str(), e.vector.as_slice())))
                .collect();
            let (vectors, kept) = e.embed_in_background(&refs, &earlier)?;
            Ok(Embedded { vectors, kept })
        })
        .await
    }

    async fn embed_query(&self, text: String) -> Result<Vec<f32>, EmbedError> {
        self.blocking(move |e| e.embed_query(&text)).await
    }

    fn pieces(&self, word: &str) -> Option<usize> {
        self.encoder.pieces(word).ok()
    }

    async fn embed_cross_query(&self, text: String) -> Option<Result<Vec<f32>, EmbedError>> {
        if !self.encoder.is_paired() {
            return None;
        }
        Some(
            self.blocking(move |e| {
                e.embed_cross_query(&text)
                    .unwrap_or_else(|| Err(anyhow::anyhow!("no cross-language model")))
            })
            .await,
        )
    }
}
