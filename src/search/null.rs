//! What "nothing here" looks like, measured rather than fixed (issue 51):
//! the semantic evidence a hybrid search reads is how far a hit stands above
//! the evidence a question on another subject would reach in the same
//! library (docs/search.md, "A relevance measured against a null").
//!
//! A fixed cosine line does not carry over: e5's similarities of unrelated
//! text sit high and close together, and how high depends on the library (a
//! library of near-identical pages, a library in another language) and on
//! the query. So each search's semantic evidence is shifted by its null, in
//! evidence units (`fusion::Calibration::unclamped`, the pair's mean):
//!
//! - **the library's null**: the upper quartile, over a fixed set of
//!   off-domain probe questions (`PROBES`: diverse subjects, several
//!   languages, embedded once per model), of the best evidence each probe
//!   reaches among the library's chunks (the top 1, what a threshold on the
//!   best hit reads): what a question on another subject reaches there at
//!   the high end, not its typical case. A quantile, so a probe that happens
//!   to be on the library's subject moves it by a rank, not by its value. Computed from the library's own vectors only
//!   (tenant rankings stay a function of the tenant's libraries), kept with
//!   the count of vectors it was measured on and measured again when that
//!   count has moved by more than a tenth (`Nulls::library`);
//! - **the query's own level**: the median evidence the query reaches
//!   against the probes embedded as passages, less the probes' own level
//!   against one another (`Probes::level`): a query that reads as close to
//!   any text (short, generic) is read from higher up. It costs one dot
//!   product per probe and search.

use std::sync::Arc;

use super::fusion::{Calibration, CROSS};
use crate::embed::{dot, EmbedError, Embedder};

/// The off-domain probe questions: everyday subjects of many kinds, short
/// as questions are, in eight languages (both models read them). Chosen
/// before any measurement, not from any labelled set; a probe that some
/// library covers only moves the null by a rank.
pub(crate) const PROBES: [&str; 24] = [
    "how do I renew my fishing licence",
    "what is the offside rule in ice hockey",
    "best way to clean a cast iron skillet",
    "how many moons does Neptune have",
    "what to wear to a job interview",
    "how long does it take to learn the violin",
    "symptoms of a vitamin D deficiency",
    "how to fix a flat bicycle tyre",
    "wie beantrage ich einen neuen Personalausweis",
    "welche Zimmerpflanzen brauchen wenig Licht",
    "wann fährt der letzte Bus nach Hause",
    "comment déclarer ses impôts en ligne",
    "quelle est la recette de la tarte tatin",
    "pourquoi les chats ronronnent-ils",
    "cuánto cuesta un billete de avión a Lima",
    "cómo se juega al ajedrez",
    "come si prepara il tiramisù",
    "quanto tempo dura a gravidez de uma vaca",
    "東京でおすすめのラーメン屋はどこですか",
    "猫の爪切りのやり方",
    "как выучить английский язык быстро",
    "如何在家种植西红柿",
    "what is the history of the saxophone",
    "how do credit scores work",
];

/// Which scan a search's semantic evidence comes from: the embedding
/// model's alone, or both models' (hybrid search with the cross-language
/// model paired, `fusion::Near::of_both`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum View {
    One,
    Pair,
}

/// A query as the two models see it: the embedding model's unit vector and,
/// paired, the cross-language model's.
pub(crate) struct QueryVectors<'a> {
    pub(crate) model: &'a [f32],
    pub(crate) cross: Option<&'a [f32]>,
}

impl QueryVectors<'_> {
    pub(crate) fn view(&self) -> View {
        match self.cross {
            Some(_) => View::Pair,
            None => View::One,
        }
    }

    /// The vector a scan scores stored vectors with: the embedding model's
    /// alone, or both, each scaled by its calibration's weight, so the dot
    /// product with a stored pair is the sum of the two unclamped
    /// evidences plus a constant (`fusion::Near::of_both`).
    pub(crate) fn scan(&self, calibration: Calibration) -> Vec<f32> {
        match self.cross {
            Some(u) => {
                let (a, b) = (calibration.weight() as f32, CROSS.weight() as f32);
                self.model.iter().map(|x| x * a).chain(u.iter().map(|x| x * b)).collect()
            }
            None => self.model.to_vec(),
        }
    }

    /// The unclamped evidence of a stored vector (`model_dim` values of the
    /// embedding model's, then the cross-language model's): what
    /// `fusion::Near` orders by.
    pub(crate) fn evidence(&self, calibration: Calibration, model_dim: usize, stored: &[f32]) -> f64 {
        let (e, c) = stored.split_at(model_dim.min(stored.len()));
        let s = calibration.unclamped(f64::from(dot(self.model, e)));
        match self.cross {
            Some(u) => (s + CROSS.unclamped(f64::from(dot(u, c)))) / 2.0,
            None => s,
        }
    }
}

/// The library null's quantile of the probes' best evidence (the upper
/// quartile: up to a quarter of the probes may be on a library's subject
/// before it reads their values).
pub(crate) const NULL_QUANTILE: f64 = 0.75;

/// The `q` quantile of `v` by nearest rank (the ⌈q·n⌉-th smallest; NaN
/// counts as the highest value; None when empty): one outlier moves it by
/// a rank, not by its value.
pub(crate) fn quantile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// The median of `v` (the mean of the middle two of an even count; NaN
/// counts as the highest value; None when empty).
pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The probes' vectors for one embedder: each as a query (both models'
/// query vectors) and as a passage (a stored vector, as the worker makes
/// it).
pub(crate) struct Probes {
    queries: Vec<(Vec<f32>, Option<Vec<f32>>)>,
    passages: Vec<Vec<f32>>,
}

impl Probes {
    /// Embeds `PROBES` with `embedder` (once per process: `Nulls`).
    async fn embed(embedder: &Embedder) -> Result<Probes, EmbedError> {
        let texts: Vec<String> = PROBES.iter().map(|p| (*p).to_owned()).collect();
        let earlier = vec![None; texts.len()];
        let passages = embedder.embed_passages(texts, earlier).await?.vectors;
        let mut queries = Vec::with_capacity(PROBES.len());
        for p in PROBES {
            queries.push(embedder.query_vectors_uncached(p).await?);
        }
        Ok(Probes { queries, passages })
    }

    fn query(&self, i: usize) -> QueryVectors<'_> {
        let (model, cross) = &self.queries[i];
        QueryVectors {
            model,
            cross: cross.as_deref(),
        }
    }

    /// Each probe as a query of `view` (the pair view needs the
    /// cross-language model's vectors: without them, none).
    fn queries_of(&self, view: View) -> impl Iterator<Item = QueryVectors<'_>> {
        (0..self.queries.len())
            .map(|i| self.query(i))
            .filter(move |q| view == View::One || q.cross.is_some())
            .map(move |q| match view {
                View::One => QueryVectors { cross: None, ..q },
                View::Pair => q,
            })
    }

    /// How close `q` reads to text on other subjects: the median of its
    /// evidence against the probes as passages, less the probes' own
    /// (each probe against the others, the median; their mean). 0 for a
    /// query that reads like the probes do.
    pub(crate) fn level(&self, calibration: Calibration, model_dim: usize, q: &QueryVectors<'_>) -> f64 {
        let against = |q: &QueryVectors<'_>, skip: Option<usize>| {
            let v: Vec<f64> = self
                .passages
                .iter()
                .enumerate()
                .filter(|(j, _)| Some(*j) != skip)
                .map(|(_, p)| q.evidence(calibration, model_dim, p))
                .collect();
            median(v).unwrap_or(0.0)
        };
        let own: Vec<f64> = self
            .queries_of(q.view())
            .enumerate()
            .map(|(i, p)| against(&p, Some(i)))
            .collect();
        let own = if own.is_empty() {
            0.0
        } else {
            own.iter().sum::<f64>() / own.len() as f64
        };
        against(q, None) - own
    }

    /// A library's null in `view`: the `NULL_QUANTILE` over the probes of the
    /// best unclamped evidence each reaches among its chunks (`best` gives the
    /// stored vector of the chunk a scan vector scores highest, None when
    /// the library holds no vector). None without vectors.
    pub(crate) fn library_null<E>(
        &self,
        view: View,
        calibration: Calibration,
        model_dim: usize,
        mut best: impl FnMut(&[f32]) -> Result<Option<Vec<f32>>, E>,
    ) -> Result<Option<f64>, E> {
        let mut tops = Vec::with_capacity(PROBES.len());
        for p in self.queries_of(view) {
            match best(&p.scan(calibration))? {
                Some(stored) => tops.push(p.evidence(calibration, model_dim, &stored)),
                None => return Ok(None),
            }
        }
        Ok(quantile(tops, NULL_QUANTILE))
    }
}

/// Whether a null measured on `then` vectors still stands for `now`: the
/// count moved by at most a tenth (an empty library's by nothing).
pub(crate) fn still_stands(then: u64, now: u64) -> bool {
    then.abs_diff(now) * 10 <= then
}

/// The probes of this process's embedder and each library's null, by
/// (library uid, view): (vectors it was measured on, null).
#[derive(Default)]
pub(crate) struct Nulls {
    probes: tokio::sync::OnceCell<Arc<Probes>>,
    libraries: std::sync::Mutex<std::collections::HashMap<(String, View), (u64, f64)>>,
}

/// Most libraries whose null is kept (past it the map starts again: a null
/// costs one scan of the library per probe to measure again).
const MAX_LIBRARIES: usize = 100_000;

impl Nulls {
    /// The probes, embedded at the first search that needs them.
    pub(crate) async fn probes(&self, embedder: &Embedder) -> Result<Arc<Probes>, EmbedError> {
        self.probes
            .get_or_try_init(|| async { Probes::embed(embedder).await.map(Arc::new) })
            .await
            .cloned()
    }

    /// `library`'s null in `view` while it holds `count` vectors: the one
    /// kept if it still stands (`still_stands`), else `measure`'s (kept;
    /// None: no vector, nothing kept, 0).
    pub(crate) fn library<E>(
        &self,
        library: &str,
        view: View,
        count: u64,
        measure: impl FnOnce() -> Result<Option<f64>, E>,
    ) -> Result<f64, E> {
        let key = (library.to_owned(), view);
        let kept = self.libraries.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied();
        if let Some((then, null)) = kept {
            if still_stands(then, count) {
                return Ok(null);
            }
        }
        let Some(null) = measure()? else {
            return Ok(0.0);
        };
        let mut map = self.libraries.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_LIBRARIES {
            map.clear();
        }
        map.insert(key, (count, null));
        Ok(null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_moved_by_a_rank_not_by_an_outlier() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![0.3]), Some(0.3));
        assert_eq!(median(vec![0.4, 0.1, 0.2]), Some(0.2));
        assert_eq!(median(vec![0.4, 0.1, 0.2, 0.3]), Some(0.25));
        // Probes off the library's subject reach 0.1–0.2; one on it reaches
        // 0.9: the null moves from 0.15 to 0.2, not towards 0.9.
        let off = vec![0.1, 0.12, 0.15, 0.18, 0.2];
        let with_one_on = [off.clone(), vec![0.9]].concat();
        assert_eq!(median(off), Some(0.15));
        assert!((median(with_one_on).unwrap() - 0.165).abs() < 1e-12);
        // A NaN sorts last: it moves the median by a rank too.
        assert_eq!(median(vec![0.1, f64::NAN, 0.2]), Some(0.2));
    }

    #[test]
    fn the_library_quantile_reads_the_high_end_and_one_probe_moves_it_a_rank() {
        assert_eq!(quantile(vec![], 0.75), None);
        assert_eq!(quantile(vec![0.3], 0.75), Some(0.3));
        // 8 probes: the 6th smallest.
        let off: Vec<f64> = (1..=8).map(|i| f64::from(i) / 100.0).collect();
        assert_eq!(quantile(off.clone(), NULL_QUANTILE), Some(0.06));
        // Two probes on the library's subject (0.9, 0.95) in place of the
        // two lowest: the null moves by two ranks, to 0.08, not to 0.9.
        let mut two_on = off[2..].to_vec();
        two_on.extend([0.9, 0.95]);
        assert_eq!(quantile(two_on, NULL_QUANTILE), Some(0.08));
        assert_eq!(quantile(vec![0.2, 0.1], 0.0), Some(0.1));
        assert_eq!(quantile(vec![0.2, 0.1], 1.0), Some(0.2));
    }

    #[test]
    fn a_null_stands_until_the_library_moved_by_a_tenth() {
        assert!(still_stands(100, 100));
        assert!(still_stands(100, 110) && still_stands(100, 90));
        assert!(!still_stands(100, 111) && !still_stands(100, 89));
        assert!(still_stands(0, 0) && !still_stands(0, 1));
        assert!(!still_stands(5, 6), "a small library is measured again at each change");
    }

    const E5: Calibration = Calibration {
        unrelated: 0.8,
        answers: 0.9,
    };

    fn unit(v: &[f32]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    /// Probes of two dimensions for the embedding model alone.
    fn probes(queries: &[[f32; 2]], passages: &[[f32; 2]]) -> Probes {
        Probes {
            queries: queries.iter().map(|q| (unit(q), None)).collect(),
            passages: passages.iter().map(|p| unit(p)).collect(),
        }
    }

    #[test]
    fn a_library_null_is_the_upper_quartile_of_the_probes_best_evidence_there() {
        let p = probes(&[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], &[[1.0, 0.0]]);
        // The library's chunks: the best of each probe is read from them.
        let chunks = [unit(&[1.0, 0.2]), unit(&[0.3, 1.0])];
        let best = |q: &[f32]| -> Result<Option<Vec<f32>>, ()> {
            Ok(chunks
                .iter()
                .max_by(|a, b| dot(q, a).total_cmp(&dot(q, b)))
                .cloned())
        };
        let null = p.library_null(View::One, E5, 2, best).unwrap().unwrap();
        let tops: Vec<f64> = [[1.0f32, 0.0], [0.0, 1.0], [1.0, 1.0]]
            .iter()
            .map(|q| {
                let q = unit(q);
                let top = chunks.iter().map(|c| dot(&q, c)).fold(f32::MIN, f32::max);
                E5.unclamped(f64::from(top))
            })
            .collect();
        assert!((null - quantile(tops, NULL_QUANTILE).unwrap()).abs() < 1e-9);
        // No vector in the library: no null.
        let none = p
            .library_null(View::One, E5, 2, |_| Ok::<_, ()>(None))
            .unwrap();
        assert_eq!(none, None);
        // The pair view needs the probes' cross-language vectors: none here.
        let pair = p.library_null(View::Pair, E5, 2, best).unwrap();
        assert_eq!(pair, None);
    }

    #[test]
    fn a_query_that_reads_like_the_probes_has_level_zero_and_a_closer_one_more() {
        // Every probe at the same angle to every other: their own level is
        // the evidence at that angle.
        let dirs: Vec<[f32; 2]> = (0..5)
            .map(|i| {
                let a = i as f32 * 0.1;
                [a.cos(), a.sin()]
            })
            .collect();
        let p = probes(&dirs, &dirs);
        // A probe itself as the query: close to the level of the others.
        let q = unit(&dirs[2]);
        let own = p.level(E5, 2, &QueryVectors { model: &q, cross: None });
        assert!(own.abs() < 2.0, "{own}");
        // A query in the middle of the probes reads closer to them than
        // one far from all of them: a higher level.
        let middle = unit(&[0.2f32.cos(), 0.2f32.sin()]);
        let far = unit(&[-1.0, 0.2]);
        let hi = p.level(E5, 2, &QueryVectors { model: &middle, cross: None });
        let lo = p.level(E5, 2, &QueryVectors { model: &far, cross: None });
        assert!(hi > lo, "{hi} {lo}");
    }

    #[test]
    fn a_kept_null_is_reused_until_the_library_moves() {
        let nulls = Nulls::default();
        let mut measured = 0;
        let mut at = |count: u64, value: f64, measured: &mut i32| {
            nulls
                .library("lib", View::Pair, count, || {
                    *measured += 1;
                    Ok::<_, ()>(Some(value))
                })
                .unwrap()
        };
        assert_eq!(at(100, 0.2, &mut measured), 0.2);
        assert_eq!(at(105, 0.9, &mut measured), 0.2, "within a tenth: kept");
        assert_eq!(measured, 1);
        assert_eq!(at(200, 0.3, &mut measured), 0.3, "moved: measured again");
        assert_eq!(measured, 2);
        // Another view or library is its own.
        let other = nulls.library("lib", View::One, 200, || Ok::<_, ()>(Some(0.5))).unwrap();
        assert_eq!(other, 0.5);
        // A library without vectors has no null and keeps none.
        let empty = nulls.library("empty", View::Pair, 0, || Ok::<_, ()>(None)).unwrap();
        assert_eq!(empty, 0.0);
    }
}
