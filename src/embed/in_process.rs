//! The in-process provider: the `mnemosyne-model` crate's encoder on
//! blocking threads (a passage batch at the lowest CPU priority, so that
//! requests take the cores first; a query at the normal one).

use std::path::Path;
use std::sync::Arc;

use mnemosyne_model::{Cross, Encoder, Kind};

use super::{Earlier, Embedded, ModelKind, Provider};

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

    /// `f` of the encoder on a blocking thread.
    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce(&Encoder) -> T + Send + 'static) -> anyhow::Result<T> {
        let encoder = self.encoder.clone();
        Ok(tokio::task::spawn_blocking(move || f(&encoder)).await?)
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

    fn kind(&self) -> ModelKind {
        match self.encoder.kind() {
            Kind::MiniLm => ModelKind::MiniLm,
            Kind::E5 => ModelKind::E5,
        }
    }

    fn is_paired(&self) -> bool {
        self.encoder.is_paired()
    }

    async fn embed_passages(&self, texts: Vec<String>, earlier: Vec<Option<Earlier>>) -> anyhow::Result<Embedded> {
        self.blocking(move |e| {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let earlier: Vec<Option<(&str, &[f32])>> = earlier
                .iter()
                .map(|e| e.as_ref().map(|e| (e.model.as_str(), e.vector.as_slice())))
                .collect();
            let (vectors, kept) = e.embed_in_background(&refs, &earlier)?;
            Ok(Embedded { vectors, kept })
        })
        .await?
    }

    async fn embed_query(&self, text: String) -> anyhow::Result<Vec<f32>> {
        self.blocking(move |e| e.embed_query(&text)).await?
    }

    fn pieces(&self, word: &str) -> Option<usize> {
        self.encoder.pieces(word).ok()
    }

    async fn embed_cross_query(&self, text: String) -> Option<anyhow::Result<Vec<f32>>> {
        if !self.encoder.is_paired() {
            return None;
        }
        Some(
            self.blocking(move |e| e.embed_cross_query(&text))
                .await
                .and_then(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("no cross-language model")))),
        )
    }
}
