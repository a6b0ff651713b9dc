//! The ingest's markdown splitter, `split(content, max_chars)`.
//!
//! Input: two bytes of `max_chars` (0..=2047, so the 64-character floor is
//! exercised too), then the document.
//!
//! Properties (text-splitter with trimming and no overlap): every chunk is
//! non-blank, has no leading newline and no trailing whitespace, is at most
//! max(max_chars, 64) characters, and the chunks are pieces of the document in
//! order: removing whitespace, their concatenation is the document's text.
use mnemosyne::service::ingest::split;

fn non_ws(s: &str) -> impl Iterator<Item = char> + '_ {
    s.chars().filter(|c| !c.is_whitespace())
}

/// The target's body: libFuzzer's input, or one committed seed.
pub fn run(data: &[u8]) {
    let [a, b, rest @ ..] = data else { return };
    let Ok(content) = std::str::from_utf8(rest) else { return };
    let max_chars = usize::from(u16::from_le_bytes([*a, *b]) % 2048);
    let chunks = split(content, max_chars);
    let cap = max_chars.max(64);
    let mut pos = 0;
    for c in &chunks {
        assert!(!c.trim().is_empty(), "blank chunk");
        assert!(
            !c.starts_with(['\n', '\r']) && c.trim_end() == c,
            "untrimmed chunk {c:?}"
        );
        let n = c.chars().count();
        assert!(n <= cap, "chunk of {n} chars > {cap}");
        // Each chunk is a slice of the document after the previous one.
        let at = content[pos..]
            .find(c.as_str())
            .expect("chunk is not a piece of the document, in order");
        assert!(content[pos..pos + at].trim().is_empty(), "text skipped before {c:?}");
        pos += at + c.len();
    }
    assert!(content[pos..].trim().is_empty(), "text lost at the end");
    assert!(non_ws(content).eq(chunks.iter().flat_map(|c| non_ws(c))));
}
