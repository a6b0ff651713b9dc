//! Caller-supplied strings that reach the MCP tools' text output (library
//! names and descriptions, collection names, item titles, sources): what may
//! not be in them, and how what is already stored is shown (issue 32). A
//! newline in a library name would otherwise let its owner forge extra
//! result lines or `source …` lines in every reader's output.

use std::borrow::Cow;
use std::fmt::Write;

/// Characters refused in such strings at write time and escaped at read
/// time: the C0/C1 controls (newline and tab included), the line and
/// paragraph separators, and the bidirectional embeddings, overrides and
/// isolates (they reorder what a reader sees).
pub fn is_forbidden(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Whether `s` holds a forbidden character.
pub fn has_forbidden(s: &str) -> bool {
    s.chars().any(is_forbidden)
}

/// `s` for one line of a tool's text block: each forbidden character as a
/// visible escape (`\n`, `\r`, `\t`, `\u{1b}`), everything else as it is.
/// Borrowed when there is nothing to escape (the common case).
pub fn inline(s: &str) -> Cow<'_, str> {
    if !has_forbidden(s) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_forbidden(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_characters_are_controls_separators_and_bidi_overrides() {
        for c in [
            '\n', '\r', '\t', '\0', '\u{1b}', '\u{7f}', '\u{85}', '\u{2028}', '\u{202e}', '\u{2066}',
        ] {
            assert!(is_forbidden(c), "{c:?}");
        }
        for c in ['a', ' ', 'é', '—', '中', '\u{200d}', '🙂'] {
            assert!(!is_forbidden(c), "{c:?}");
        }
    }

    #[test]
    fn inline_escapes_what_would_break_the_line() {
        assert!(matches!(inline("Plain — name"), Cow::Borrowed("Plain — name")));
        assert_eq!(inline("a\nb\r\tc"), "a\\nb\\r\\tc");
        assert_eq!(inline("x\u{1b}[31my"), "x\\u{1b}[31my");
        assert_eq!(inline("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert!(!has_forbidden(&inline("\n\u{2029}\u{0}")));
    }
}
