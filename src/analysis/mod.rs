//! Text analysis for keyword search, done here (never by the graph server's
//! analyzer) and identically at ingest and at query time:
//!
//! 1. Unicode NFKC (full-width forms, ligatures) and lower case;
//! 2. words are maximal runs of alphanumeric characters;
//! 3. runs of CJK characters (Han, Hiragana, Katakana, Hangul) become
//!    overlapping character bigrams (a lone character stays a unigram), so
//!    `地下鉄` inside `東京の地下鉄は便利です` is found;
//! 4. other words are folded — diacritics removed (NFD, combining marks
//!    dropped), `ß`→`ss`, `æ`→`ae`, `œ`→`oe`, `ø`→`o`, `ł`→`l`, `đ`→`d`,
//!    `þ`→`th` — and stemmed with the library's Snowball stemmer (English by
//!    default), so `Zürich`/`zurich` and `tides`/`tide` meet; English stems
//!    are then respelled so that one inflection's spellings meet
//!    (`dialling`/`dialing`, `panicking`/`panic`, `organise`/`organize`:
//!    `respell_english`);
//! 5. at query time, the stop words of English and of the library's language
//!    are dropped (unless nothing else is left), so common words do not swamp
//!    a question.
//!
//! A token is kept within `[a-z0-9]`: anything else (a CJK bigram, Greek,
//! Cyrillic) is hex-encoded behind an `x`, so every token survives the
//! server's whitespace analysis as one term.

pub mod scoped;

use std::collections::HashSet;
use std::sync::LazyLock;

use rust_stemmers::{Algorithm, Stemmer};
use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;

/// Longest token kept (the server's analyzer splits tokens over 255 bytes).
const MAX_TOKEN: usize = 120;

/// A library's language: the Snowball stemmer and stop words it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Language {
    English,
    German,
    French,
    Spanish,
    Italian,
    Portuguese,
    Dutch,
    Danish,
    Swedish,
    Norwegian,
    Finnish,
    Russian,
}

/// Every language, with its ISO 639-1 code (what the API and the graph use).
pub const LANGUAGES: &[(Language, &str)] = &[
    (Language::English, "en"),
    (Language::German, "de"),
    (Language::French, "fr"),
    (Language::Spanish, "es"),
    (Language::Italian, "it"),
    (Language::Portuguese, "pt"),
    (Language::Dutch, "nl"),
    (Language::Danish, "da"),
    (Language::Swedish, "sv"),
    (Language::Norwegian, "no"),
    (Language::Finnish, "fi"),
    (Language::Russian, "ru"),
];

impl Language {
    /// The language of an ISO 639-1 code; `None` for one without a stemmer.
    pub fn from_code(code: &str) -> Option<Language> {
        LANGUAGES.iter().find(|(_, c)| *c == code).map(|(l, _)| *l)
    }

    /// A stored code (absent or unknown: English, the default).
    pub fn of_stored(code: Option<&str>) -> Language {
        code.and_then(Language::from_code).unwrap_or(Language::English)
    }

    pub fn code(self) -> &'static str {
        LANGUAGES
            .iter()
            .find(|(l, _)| *l == self)
            .map(|(_, c)| *c)
            .unwrap_or("en")
    }

    fn whatlang(self) -> whatlang::Lang {
        use whatlang::Lang as W;
        match self {
            Language::English => W::Eng,
            Language::German => W::Deu,
            Language::French => W::Fra,
            Language::Spanish => W::Spa,
            Language::Italian => W::Ita,
            Language::Portuguese => W::Por,
            Language::Dutch => W::Nld,
            Language::Danish => W::Dan,
            Language::Swedish => W::Swe,
            Language::Norwegian => W::Nob,
            Language::Finnish => W::Fin,
            Language::Russian => W::Rus,
        }
    }

    fn algorithm(self) -> Algorithm {
        match self {
            Language::English => Algorithm::English,
            Language::German => Algorithm::German,
            Language::French => Algorithm::French,
            Language::Spanish => Algorithm::Spanish,
            Language::Italian => Algorithm::Italian,
            Language::Portuguese => Algorithm::Portuguese,
            Language::Dutch => Algorithm::Dutch,
            Language::Danish => Algorithm::Danish,
            Language::Swedish => Algorithm::Swedish,
            Language::Norwegian => Algorithm::Norwegian,
            Language::Finnish => Algorithm::Finnish,
            Language::Russian => Algorithm::Russian,
        }
    }
}

/// The analyzer of one language (built once per language).
pub struct Analyzer {
    stemmer: Stemmer,
    /// English stems are respelled after Snowball (`respell_english`).
    english: bool,
    /// Folded stop words of English and of this language.
    stop: HashSet<String>,
}

/// Stop words the NLTK lists lack, by language: the question words (English's
/// list holds what, when, where, which, who, whom, why and how; German's only
/// wie, was, wo and welche, French's none but qu, que and qui), the modal
/// forms beside those the lists hold, and a few contractions and inflected
/// forms of listed words. Kept in a question, `Warum` or `Pourquoi` was a
/// word the library barely holds, so it weighed most and the page that
/// answers lacked it: its share of the question fell below what hybrid's
/// threshold reads as an answer (docs/search.md, issue 51).
const MORE_STOP_WORDS: &[(&str, &[&str])] = &[
    (
        "de",
        &[
            "warum", "wann", "wer", "wen", "wem", "wessen", "weshalb", "weswegen", "wieso", "wozu", "wodurch", "womit",
            "wofür", "woher", "wohin", "worauf", "woran", "worin", "worüber", "worum", "wovon", "wovor", "wobei",
            "beim", "ans", "aufs", "durchs", "fürs", "ums", "darf", "dürfen", "durfte", "müssen", "müsste", "sollen",
            "sollten", "möchte", "konnte", "konnten",
        ],
    ),
    (
        "fr",
        &[
            "pourquoi",
            "comment",
            "quand",
            "combien",
            "quel",
            "quelle",
            "quels",
            "quelles",
            "lequel",
            "laquelle",
            "lesquels",
            "lesquelles",
            "quoi",
            "dont",
            "si",
            "elles",
            "leurs",
            "cette",
            "cet",
            "peut",
            "peuvent",
            "faut",
            "doit",
            "doivent",
        ],
    ),
];

/// Each language's own stop words, folded (English's are not in the
/// others': an analyzer holds both, `ANALYZERS`).
static OWN_STOP: LazyLock<Vec<(Language, HashSet<String>)>> = LazyLock::new(|| {
    LANGUAGES
        .iter()
        .map(|(lang, code)| {
            let more = MORE_STOP_WORDS
                .iter()
                .filter(|(c, _)| c == code)
                .flat_map(|(_, words)| words.iter().copied());
            let words = stop_words::lookup(code).unwrap_or_default().iter().copied().chain(more);
            let folded = words
                .map(|w| fold(&w.nfkc().collect::<String>().to_lowercase()))
                .collect();
            (*lang, folded)
        })
        .collect()
});

fn own_stop(language: Language) -> &'static HashSet<String> {
    let all = &*OWN_STOP;
    all.iter()
        .find(|(l, _)| *l == language)
        .map(|(_, s)| s)
        .unwrap_or(&all[0].1)
}

static ANALYZERS: LazyLock<Vec<(Language, Analyzer)>> = LazyLock::new(|| {
    LANGUAGES
        .iter()
        .map(|(lang, _)| {
            let mut stop = own_stop(Language::English).clone();
            stop.extend(own_stop(*lang).iter().cloned());
            (
                *lang,
                Analyzer {
                    stemmer: Stemmer::create(lang.algorithm()),
                    english: *lang == Language::English,
                    stop,
                },
            )
        })
        .collect()
});

static DETECTOR: LazyLock<whatlang::Detector> =
    LazyLock::new(|| whatlang::Detector::with_allowlist(LANGUAGES.iter().map(|(l, _)| l.whatlang()).collect()));

/// The language `text` is written in, when it says so clearly (one of
/// `LANGUAGES`): a chunk is analyzed in its own language, so a German page in
/// an English library is stemmed as German.
pub fn detect(text: &str) -> Option<Language> {
    let info = DETECTOR.detect(text)?;
    info.is_reliable().then(|| from_whatlang(info.lang())).flatten()
}

/// The most likely language of `text` (a short query rarely says clearly):
/// whatlang's guess, unless it is unreliable and the text holds more of
/// another language's own stop words than of the guessed one's (the first
/// such language with the most of them, in `LANGUAGES` order): whatlang reads
/// "Warum braucht Roggenbrot Sauerteig?" as Dutch, and its `warum` is German.
/// A text without stop words keeps whatlang's guess.
pub fn guess(text: &str) -> Option<Language> {
    let info = DETECTOR.detect(text)?;
    let guessed = from_whatlang(info.lang());
    if info.is_reliable() {
        return guessed;
    }
    let normal: String = text.nfkc().collect::<String>().to_lowercase();
    let words: Vec<String> = normal
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(fold)
        .collect();
    let count = |l: Language| words.iter().filter(|w| own_stop(l).contains(*w)).count();
    let mut best = (guessed, guessed.map_or(0, count));
    for (l, _) in LANGUAGES {
        let n = count(*l);
        if n > best.1 {
            best = (Some(*l), n);
        }
    }
    best.0
}

fn from_whatlang(l: whatlang::Lang) -> Option<Language> {
    LANGUAGES.iter().map(|(x, _)| *x).find(|x| x.whatlang() == l)
}

/// The analyzer of `language`.
pub fn analyzer(language: Language) -> &'static Analyzer {
    let all = &*ANALYZERS;
    all.iter()
        .find(|(l, _)| *l == language)
        .map(|(_, a)| a)
        .unwrap_or(&all[0].1)
}

/// Whether `c` belongs to a script written without spaces between words.
pub(crate) fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // Hiragana, Katakana
        | 0x31F0..=0x31FF    // Katakana phonetic extensions
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0xF900..=0xFAFF    // CJK compatibility ideographs
        | 0xFF66..=0xFF9F    // half-width Katakana
        | 0x20000..=0x2FA1F) // CJK extensions B–F, compatibility supplement
}

/// Diacritics removed and the letters without a decomposition spelled out.
pub fn fold(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    for c in word.nfd() {
        if is_combining_mark(c) {
            continue;
        }
        match c {
            'ß' => out.push_str("ss"),
            'æ' => out.push_str("ae"),
            'œ' => out.push_str("oe"),
            'ø' => out.push('o'),
            'ł' => out.push('l'),
            'đ' | 'ð' => out.push('d'),
            'þ' => out.push_str("th"),
            'ı' => out.push('i'),
            c => out.push(c),
        }
    }
    out
}

/// Endings a British root in `SPELLINGS` is met with: nothing, a plural or
/// third person, a past, a comparative or agent, a participle, an adverb or
/// an adjective (`centres`, `centred`, `greyer`, `mouldy`).
const INFLECTIONS: &[&str] = &["", "s", "d", "ed", "es", "er", "ers", "ing", "ly", "y"];

/// British roots and their American spelling, matched at a word's end
/// (before one of `INFLECTIONS`; `kilometre`, `epicentres` and `sunburnt`
/// too). A root ending in a silent `e` the American spelling lacks also
/// meets its `-ing` without the `e` (`centring` → `centering`), and its `d`
/// becomes `ed` (`centred` → `centered`). Left out on purpose: words whose
/// American spelling is another English word (`tyre`/`tire`,
/// `cheque`/`check`, `kerb`/`curb`, `draught`/`draft`, `storey`/`story`),
/// and pasts that are also nouns (`spelt`, `smelt`).
const SPELLINGS: &[(&str, &str)] = &[
    ("centre", "center"),
    ("metre", "meter"),
    ("litre", "liter"),
    ("theatre", "theater"),
    ("fibre", "fiber"),
    ("calibre", "caliber"),
    ("sabre", "saber"),
    ("sombre", "somber"),
    ("lustre", "luster"),
    ("spectre", "specter"),
    ("meagre", "meager"),
    ("manoeuvre", "maneuver"),
    ("catalogue", "catalog"),
    ("dialogue", "dialog"),
    ("analogue", "analog"),
    ("monologue", "monolog"),
    ("prologue", "prolog"),
    ("epilogue", "epilog"),
    ("programme", "program"),
    ("defence", "defense"),
    ("offence", "offense"),
    ("licence", "license"),
    ("pretence", "pretense"),
    ("practise", "practice"),
    ("grey", "gray"),
    ("aluminium", "aluminum"),
    ("jewellery", "jewelry"),
    ("jeweller", "jeweler"),
    ("skilful", "skillful"),
    ("wilful", "willful"),
    ("fulfil", "fulfill"),
    ("fulfilment", "fulfillment"),
    ("enrol", "enroll"),
    ("enrolment", "enrollment"),
    ("instalment", "installment"),
    ("ageing", "aging"),
    ("judgement", "judgment"),
    ("acknowledgement", "acknowledgment"),
    ("cosy", "cozy"),
    ("burnt", "burned"),
    ("learnt", "learned"),
    ("dreamt", "dreamed"),
    ("spoilt", "spoiled"),
    ("spilt", "spilled"),
    ("leapt", "leaped"),
    ("knelt", "kneeled"),
    ("dwelt", "dwelled"),
];

/// British spellings met anywhere in a word (`haemoglobin`, `anaesthetist`,
/// `unfocussed`, `sulphate`, `ploughing`, `smouldering`).
const INNER_SPELLINGS: &[(&str, &str)] = &[
    ("focuss", "focus"),
    ("biass", "bias"),
    ("haem", "hem"),
    ("anaem", "anem"),
    ("leukaem", "leukem"),
    ("anaesth", "anesth"),
    ("paediatr", "pediatr"),
    ("orthopaed", "orthoped"),
    ("encyclopaed", "encycloped"),
    ("oesophag", "esophag"),
    ("oestr", "estr"),
    ("foet", "fet"),
    ("diarrhoe", "diarrhe"),
    ("sulph", "sulf"),
    ("sceptic", "skeptic"),
    ("plough", "plow"),
    ("mould", "mold"),
    ("moult", "molt"),
    ("pyjama", "pajama"),
];

/// How a pattern of `SPELLINGS_AC` is taken.
#[derive(Clone, Copy)]
enum Spelling {
    /// Anywhere in the word.
    Inner,
    /// At the word's end, before one of `INFLECTIONS`.
    Root,
    /// A silent-e root without its `e`, before `-ing` only.
    RootStem,
}

/// Every spelling in one automaton (leftmost-longest: `centre` before
/// `centr`), with its replacement and kind by pattern index.
static SPELLINGS_AC: LazyLock<(aho_corasick::AhoCorasick, Vec<(&'static str, Spelling)>)> = LazyLock::new(|| {
    let mut patterns: Vec<String> = Vec::new();
    let mut replacements = Vec::new();
    for &(british, american) in INNER_SPELLINGS {
        patterns.push(british.to_owned());
        replacements.push((american, Spelling::Inner));
    }
    for &(british, american) in SPELLINGS {
        patterns.push(british.to_owned());
        replacements.push((american, Spelling::Root));
        if let Some(stem) = british.strip_suffix('e').filter(|_| !american.ends_with('e')) {
            patterns.push(stem.to_owned());
            replacements.push((american, Spelling::RootStem));
        }
    }
    let ac = aho_corasick::AhoCorasick::builder()
        .match_kind(aho_corasick::MatchKind::LeftmostLongest)
        .build(&patterns)
        .expect("spelling patterns build");
    (ac, replacements)
});

/// A folded English word with its British spellings written the American
/// way, before the stemmer (at ingest and at query time alike;
/// `scoped::ANALYSIS_VERSION` 5), so `colour`/`color`, `centred`/`centered`,
/// `haemoglobin`/`hemoglobin` and `learnt`/`learned` meet. None: the word
/// stands. Since both sides are rewritten the same way, a rewrite only
/// matters where it joins two words, so the rules stay where that is wanted:
///
/// - `-our` becomes `-or` after a consonant (or the `i` of `-iour`) that has
///   a vowel before it: `colour`, `honourable`, `behaviour`, `neighbourhood`;
///   `four`, `hour`, `your`, `tour`, `flour`, `pour` and `courage` stay;
/// - the roots of `SPELLINGS` at the word's end, before an inflection;
/// - the fragments of `INNER_SPELLINGS` anywhere.
fn american_spelling(word: &str) -> Option<String> {
    let b = word.as_bytes();
    if b.len() < 4 || !b.iter().all(|c| c.is_ascii_lowercase()) {
        return None;
    }
    let (ac, replacements) = &*SPELLINGS_AC;
    // Allocated only when a spelling is taken (most words have none).
    let mut out: Option<String> = None;
    let mut last = 0;
    for m in ac.find_iter(word) {
        let (american, kind) = replacements[m.pattern().as_usize()];
        let rest = &word[m.end()..];
        let british = &word[m.start()..m.end()];
        let taken = match kind {
            Spelling::Inner => true,
            Spelling::Root => INFLECTIONS.contains(&rest),
            Spelling::RootStem => rest == "ing",
        };
        if !taken {
            continue;
        }
        let o = out.get_or_insert_with(|| String::with_capacity(word.len() + 2));
        o.push_str(&word[last..m.start()]);
        o.push_str(american);
        last = m.end();
        if matches!(kind, Spelling::Root) && rest == "d" && british.ends_with('e') && !american.ends_with('e') {
            o.push_str("ed");
            last = word.len();
        }
    }
    match out {
        Some(mut o) => {
            o.push_str(&word[last..]);
            Some(american_or(&o).unwrap_or(o))
        }
        None => american_or(word),
    }
}

/// `-our` written `-or` where `american_spelling` says (None: no `-our`).
fn american_or(word: &str) -> Option<String> {
    if !word.contains("our") {
        return None;
    }
    let b = word.as_bytes();
    let vowel = |c: u8| matches!(c, b'a' | b'e' | b'i' | b'o' | b'u');
    let consonant = |c: u8| c.is_ascii_lowercase() && !vowel(c);
    let mut out = String::with_capacity(word.len());
    let mut changed = false;
    let mut from = 0;
    while let Some(at) = word[from..].find("our").map(|i| i + from) {
        out.push_str(&word[from..at]);
        // The letter before `our`: a consonant, or the `i` of `-iour` after one.
        let before = match at.checked_sub(1).map(|i| b[i]) {
            Some(c) if consonant(c) => Some(at - 1),
            Some(b'i') if at >= 2 && consonant(b[at - 2]) => Some(at - 2),
            _ => None,
        };
        if before.is_some_and(|i| b[..i].iter().any(|&c| vowel(c))) {
            out.push_str("or");
            changed = true;
        } else {
            out.push_str("our");
        }
        from = at + 3;
    }
    out.push_str(&word[from..]);
    changed.then_some(out)
}

/// An English Snowball (Porter2) stem respelled so that the spellings of one
/// inflection meet (applied to every English stem, at ingest and at query
/// time alike; `scoped::ANALYSIS_VERSION` 4). None: the stem stands.
///
/// - A root with two vowels before a doubled `l`, `z` or `s` loses the
///   second (`diall` → `dial`, `fuell` → `fuel`, `quizz` → `quiz`): Snowball
///   undoubles bb dd ff gg mm nn pp rr tt before -ed/-ing, and `ll` only
///   where its R2 reaches (`travell` → `travel`, but not `diall`).
/// - The `k` English adds to -ic before -ing/-ed goes, in a root of more
///   than one syllable (`panick` → `panic`, `mimick`, `traffick`, `picnick`;
///   `pick`, `kick` stay). Only after `i`: `Lübeck`'s English stem stays
///   `lubeck`, as its German one is, so an English query meets a German page.
/// - British -ise/-yse meet American -ize/-yze: Snowball removes -ize where
///   its R2 holds it (`organize` → `organ`) and keeps `iz` otherwise
///   (`realize` → `realiz`), and keeps -yze (`analyz`); a stem ending in `is`
///   or `ys` is read the same way (`organis` → `organ`, `realis` → `realiz`,
///   `analys` → `analyz`; `this`, `his` stay).
///
/// A monosyllable keeps its doubled consonant (`fill`; so `gel` and `gelled`
/// do not meet, where undoubling would join `fill` and `fil`).
fn respell_english(stem: &str) -> Option<String> {
    let b = stem.as_bytes();
    let n = b.len();
    if n < 4 || !b.iter().all(u8::is_ascii_lowercase) {
        return None;
    }
    let vowel = |i: usize| porter_vowel(b, i);
    let has_vowel = |end: usize| (0..end).any(vowel);
    let (last, prev) = (b[n - 1], b[n - 2]);
    let mut out = stem.to_owned();
    let doubled = last == prev && matches!(last, b'l' | b'z' | b's') && vowel(n - 3) && vowel(n - 4);
    let ic_k = last == b'k' && prev == b'c' && b[n - 3] == b'i' && has_vowel(n - 3);
    if doubled || ic_k {
        out.pop();
    } else if last == b's' && prev == b'y' && has_vowel(n - 2) {
        out.pop();
        out.push('z');
    } else if last == b's' && prev == b'i' && has_vowel(n - 2) {
        out.truncate(n - 2);
        if porter_r2(b) > n - 2 {
            out.push_str("iz");
        }
    } else {
        return None;
    }
    Some(out)
}

/// Whether `b[i]` is a vowel as Porter2 reads it: `y` is a consonant at the
/// start and after a vowel.
fn porter_vowel(b: &[u8], i: usize) -> bool {
    match b[i] {
        b'a' | b'e' | b'i' | b'o' | b'u' => true,
        b'y' => i > 0 && !porter_vowel(b, i - 1),
        _ => false,
    }
}

/// Where Porter2's R2 starts in `b` (its length when R2 is empty).
fn porter_r2(b: &[u8]) -> usize {
    // The region after the first non-vowel that follows a vowel, from `start`.
    let after = |start: usize| {
        (start + 1..b.len())
            .find(|&i| porter_vowel(b, i - 1) && !porter_vowel(b, i))
            .map_or(b.len(), |i| i + 1)
    };
    let r1 = ["gener", "commun", "arsen"]
        .iter()
        .find(|p| b.starts_with(p.as_bytes()))
        .map_or_else(|| after(0), |p| p.len());
    after(r1)
}

/// A token as the index stores it: `[a-z0-9]` kept, anything else hex behind `x`.
fn encode(token: &str) -> String {
    let t: String = if token.bytes().all(|b| b.is_ascii_alphanumeric()) {
        token.to_owned()
    } else {
        format!("x{}", hex::encode(token.as_bytes()))
    };
    t.chars().take(MAX_TOKEN).collect()
}

/// One analyzed token and whether it is a stop word.
struct Token {
    text: String,
    stop: bool,
    /// The token the word had before `american_spelling` rewrote it (None:
    /// not rewritten). A query searches it too, in the word's group: a page
    /// another language's analyzer read keeps the British spelling
    /// (`kilometre` in a French page is the French stem `kilometr`).
    british: Option<String>,
}

impl Analyzer {
    /// Every token of `text`, in order, with repeats (term frequencies and
    /// lengths follow the text).
    fn analyze(&self, text: &str, out: &mut Vec<Token>) {
        let normal: String = text.nfkc().collect::<String>().to_lowercase();
        for run in normal.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()) {
            // Split the run into CJK and other segments.
            let mut rest = run;
            while let Some(first) = rest.chars().next() {
                let cjk = is_cjk(first);
                let end = rest
                    .char_indices()
                    .find(|(_, c)| is_cjk(*c) != cjk)
                    .map(|(i, _)| i)
                    .unwrap_or(rest.len());
                let (segment, tail) = rest.split_at(end);
                rest = tail;
                if cjk {
                    let chars: Vec<char> = segment.chars().collect();
                    if chars.len() == 1 {
                        out.push(Token {
                            text: encode(segment),
                            stop: false,
                            british: None,
                        });
                    }
                    for pair in chars.windows(2) {
                        out.push(Token {
                            text: encode(&pair.iter().collect::<String>()),
                            stop: false,
                            british: None,
                        });
                    }
                } else {
                    // Folding can leave nothing (a run of combining marks
                    // that count as letters), and a stemmer may strip a
                    // word to nothing: no empty token is ever kept.
                    let folded = fold(segment);
                    if folded.is_empty() {
                        continue;
                    }
                    let stop = self.stop.contains(&folded);
                    let american = if self.english { american_spelling(&folded) } else { None };
                    let text = self.stem_token(american.as_deref().unwrap_or(&folded));
                    let british = american
                        .is_some()
                        .then(|| self.stem_token(&folded))
                        .filter(|b| *b != text);
                    out.push(Token { text, stop, british });
                }
            }
        }
    }

    /// A folded word's token: its stem (respelled in English), or the word
    /// when the stemmer leaves nothing.
    fn stem_token(&self, folded: &str) -> String {
        let mut stem = self.stemmer.stem(folded);
        if self.english {
            if let Some(respelled) = respell_english(&stem) {
                stem = respelled.into();
            }
        }
        encode(if stem.is_empty() { folded } else { &stem })
    }

    /// The tokens of a text to index.
    pub fn tokens(&self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.analyze(text, &mut out);
        out.into_iter().map(|t| t.text).collect()
    }

    /// The distinct terms of a query, in order, at most `max`: stop words
    /// left out unless the query has nothing else.
    pub fn query_terms(&self, query: &str, max: usize) -> Vec<String> {
        query_terms(&[self], query, max)
    }
}

/// Whether `query` gives keyword search any term at all: some letter or
/// digit survives the analysis (the same in every language: analyzers differ
/// in stems and stop words, never in what they split off). A query of
/// punctuation, operators, symbols and spaces alone (`*`, `?`, `()`, `--`,
/// `"`) has none: search answers it with nothing in every mode
/// (`search::engine::Engine::run`).
pub fn has_terms(query: &str) -> bool {
    let mut out = Vec::new();
    analyzer(Language::English).analyze(query, &mut out);
    !out.is_empty()
}

/// The distinct terms of a query analyzed by each of `analyzers` (a word
/// stemmed differently in two languages gives both stems), in order, at most
/// `max`: a word that is a stop word in any of them is left out unless the
/// query has nothing else.
pub fn query_terms(analyzers: &[&Analyzer], query: &str, max: usize) -> Vec<String> {
    query_terms_grouped(analyzers, query, max).0
}

/// `query_terms`, with the query word each term comes from (`groups[i]` for
/// `terms[i]`): the stems of one word share a group, so relevance counts the
/// word once whichever of its forms a chunk holds (`rank::score_grouped`).
pub fn query_terms_grouped(analyzers: &[&Analyzer], query: &str, max: usize) -> (Vec<String>, Vec<usize>) {
    let per: Vec<Vec<Token>> = analyzers
        .iter()
        .map(|a| {
            let mut out = Vec::new();
            a.analyze(query, &mut out);
            out
        })
        .collect();
    // Every analyzer splits alike: positions line up.
    let len = per.first().map_or(0, Vec::len);
    let stop: Vec<bool> = (0..len).map(|i| per.iter().any(|p| p[i].stop)).collect();
    let content = stop.iter().any(|s| !s);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut groups = Vec::new();
    for i in (0..len).filter(|i| !(content && stop[*i])) {
        for p in &per {
            for t in std::iter::once(&p[i].text).chain(&p[i].british) {
                if seen.insert(t.clone()) {
                    out.push(t.clone());
                    groups.push(i);
                }
            }
        }
    }
    out.truncate(max);
    groups.truncate(max);
    (out, groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn en(text: &str) -> Vec<String> {
        analyzer(Language::English).tokens(text)
    }

    #[test]
    fn diacritics_case_and_sharp_s_fold_on_both_sides() {
        assert_eq!(en("Zürich"), en("zurich"));
        assert_eq!(en("Café"), en("CAFE"));
        assert_eq!(en("Lübeck"), en("lubeck"));
        assert_eq!(en("Straßenbahn"), en("strassenbahn"));
        assert_eq!(en("Müller"), en("MULLER"));
        assert_eq!(en("crème brûlée"), en("creme brulee"));
        assert_eq!(en("Ｚｕｒｉｃｈ"), en("zurich"), "full-width forms");
    }

    #[test]
    fn english_stemming_joins_inflections() {
        assert_eq!(en("tides"), en("tide"));
        assert_eq!(en("baking"), en("baked"));
        assert_eq!(en("indexes"), en("indexing"));
    }

    /// English inflections that differ only in spelling meet: Snowball
    /// undoubles bb dd ff gg mm nn pp rr tt before -ed/-ing but not the `l`
    /// of a short root (`dialled` → `diall`), nor `zz`; it keeps the `k`
    /// added before -ing/-ed after -ic (`panicking` → `panick`); and it
    /// stems British -ise/-yse apart from American -ize/-yze.
    #[test]
    fn english_spellings_of_one_inflection_meet() {
        let groups: &[&[&str]] = &[
            &["dial", "dials", "dialing", "dialling", "dialed", "dialled"],
            &["fuel", "fueling", "fuelling", "fueled", "fuelled"],
            &["trial", "trialing", "trialling", "trialed", "trialled"],
            &["duel", "dueling", "duelling"],
            &["travel", "traveling", "travelling", "traveled", "travelled"],
            &["cancel", "canceling", "cancelling", "canceled", "cancelled"],
            &["quiz", "quizzes", "quizzed", "quizzing"],
            &["panic", "panics", "panicking", "panicked"],
            &["mimic", "mimics", "mimicking", "mimicked"],
            &["picnic", "picnicking", "picnicked"],
            &["traffic", "trafficking", "trafficked"],
            &[
                "organise",
                "organize",
                "organised",
                "organized",
                "organising",
                "organizing",
            ],
            &["organisation", "organization"],
            &[
                "tokenise",
                "tokenize",
                "tokenised",
                "tokenized",
                "tokenising",
                "tokenizing",
            ],
            &["analyse", "analyze", "analysed", "analyzed", "analysing", "analyzing"],
        ];
        for group in groups {
            let first = en(group[0]);
            for w in &group[1..] {
                assert_eq!(en(w), first, "{w} / {}", group[0]);
            }
        }
    }

    /// British spellings meet the American ones (`american_spelling`, before
    /// the stemmer): each group analyses to one token.
    #[test]
    fn british_and_american_spellings_meet() {
        let groups: &[&[&str]] = &[
            &[
                "colour",
                "color",
                "colours",
                "colors",
                "coloured",
                "colored",
                "colouring",
                "coloring",
            ],
            &["colourful", "colorful"],
            &["honour", "honor", "honoured", "honored"],
            &["honourable", "honorable"],
            &["behaviour", "behavior", "behaviours", "behaviors"],
            &["behavioural", "behavioral"],
            &["neighbour", "neighbor", "neighbours"],
            &["neighbourhood", "neighborhood"],
            &["favourite", "favorite", "favourites"],
            &["labour", "labor", "labouring", "laboring"],
            &["flavour", "flavor", "flavoured", "flavored"],
            &["humour", "humor"],
            &["harbour", "harbor"],
            &["centre", "center", "centres", "centers"],
            &["centred", "centered", "centring", "centering"],
            &["kilometre", "kilometer", "kilometres", "kilometers"],
            &["litre", "liter", "litres", "liters"],
            &["millilitres", "milliliters"],
            &["theatre", "theater", "theatres"],
            &["fibre", "fiber", "fibres", "fibers"],
            &["manoeuvre", "maneuver", "manoeuvring", "maneuvering"],
            &[
                "catalogue",
                "catalog",
                "catalogues",
                "catalogs",
                "catalogued",
                "cataloged",
            ],
            &["dialogue", "dialog", "dialogues"],
            &["programme", "program", "programmes", "programs"],
            &["defence", "defense", "defences"],
            &["licence", "license", "licences", "licenses"],
            &["practise", "practice", "practised", "practiced"],
            &["grey", "gray", "greys", "grays", "greying", "graying"],
            &["greyer", "grayer"],
            &["aluminium", "aluminum"],
            &["jewellery", "jewelry"],
            &["haemoglobin", "hemoglobin"],
            &["anaemia", "anemia"],
            &["leukaemia", "leukemia"],
            &["anaesthetist", "anesthetist"],
            &["paediatric", "pediatric"],
            &["oesophagus", "esophagus"],
            &["oestrogen", "estrogen"],
            &["foetus", "fetus"],
            &["diarrhoea", "diarrhea"],
            &["sulphur", "sulfur"],
            &["sulphate", "sulfate"],
            &["sceptical", "skeptical"],
            &["plough", "plow", "ploughing", "plowing"],
            &["mould", "mold", "moulds", "molds", "moulding", "molding"],
            &["mouldy", "moldy"],
            &["smouldering", "smoldering"],
            &["focussed", "focused"],
            &["biassed", "biased"],
            &["learnt", "learned"],
            &["burnt", "burned"],
            &["sunburnt", "sunburned"],
            &["dreamt", "dreamed"],
            &["spilt", "spilled"],
            &["skilful", "skillful"],
            &["fulfilment", "fulfillment"],
            &["enrolment", "enrollment"],
            &["judgement", "judgment"],
            &["ageing", "aging"],
            &["pyjamas", "pajamas"],
        ];
        let apart: Vec<String> = groups
            .iter()
            .flat_map(|g| g[1..].iter().map(move |w| (g[0], *w)))
            .filter(|(a, b)| en(a) != en(b))
            .map(|(a, b)| format!("{a} {:?} / {b} {:?}", en(a), en(b)))
            .collect();
        assert!(apart.is_empty(), "{apart:#?}");
    }

    /// A query also searches the British spelling's own stem, in the same
    /// group: another language's page keeps it (`kilometre` in French).
    #[test]
    fn a_query_searches_the_british_stem_beside_the_american_one() {
        let (en, fr) = (analyzer(Language::English), analyzer(Language::French));
        let (terms, groups) = query_terms_grouped(&[en], "tram per kilometre", 8);
        assert!(terms.contains(&en.tokens("kilometer")[0]), "{terms:?}");
        assert!(terms.contains(&fr.tokens("kilomètre")[0]), "{terms:?}");
        let at = |t: &str| groups[terms.iter().position(|x| x == t).unwrap()];
        assert_eq!(at(&en.tokens("kilometer")[0]), at(&fr.tokens("kilomètre")[0]));
        // Indexed text gets the American token only.
        assert_eq!(en.tokens("kilometre"), en.tokens("kilometer"));
        // A word the rewrite leaves alone gives one term.
        assert_eq!(query_terms_grouped(&[en], "tram", 8).0.len(), 1);
    }

    /// The rewrite stays where it joins spellings of one word: other words,
    /// and other languages, keep their own tokens.
    #[test]
    fn american_spelling_leaves_other_words_alone() {
        let apart: &[(&str, &str)] = &[
            ("four", "for"),
            ("hour", "hor"),
            ("your", "yor"),
            ("tour", "tor"),
            ("flour", "floor"),
            ("pour", "poor"),
            ("central", "center"),
            ("concentrate", "concenter"),
            ("tyre", "tire"),
            ("cheque", "check"),
            ("kerb", "curb"),
            ("draught", "draft"),
            ("storey", "story"),
            ("spelt", "spelled"),
            ("greyhound", "grayhound"),
            ("courage", "corage"),
            ("journal", "jornal"),
        ];
        for (a, b) in apart {
            assert_ne!(en(a), en(b), "{a} and {b}");
        }
        for w in [
            "four",
            "hour",
            "your",
            "tour",
            "flour",
            "course",
            "central",
            "metric",
            "theatrical",
        ] {
            assert_eq!(american_spelling(w), None, "{w}");
        }
        // German and French words are never rewritten.
        let de = analyzer(Language::German);
        assert_eq!(de.tokens("Zentrum Theater Farbe"), de.tokens("zentrum theater farbe"));
        assert_ne!(de.tokens("Colour"), de.tokens("color"));
    }

    #[test]
    fn respelled_stems_keep_unrelated_words_apart() {
        for (a, b) in [
            ("pick", "picnic"),
            ("tick", "tic"),
            ("dial", "dull"),
            ("fill", "fil"),
            ("quiz", "quit"),
            ("panic", "pan"),
            ("organ", "orange"),
            ("his", "hiz"),
            ("rise", "riz"),
            ("analysis", "anal"),
        ] {
            assert_ne!(en(a), en(b), "{a} / {b}");
        }
        // Only -ick loses its k: a German name keeps the stem German gives it.
        assert_eq!(en("Lübeck"), analyzer(Language::German).tokens("Lübeck"));
        // A monosyllable keeps its k and its double consonant.
        assert_eq!(en("kicking"), ["kick"]);
        assert_eq!(en("filled"), ["fill"]);
        // Other languages' stems are never respelled.
        let fr = analyzer(Language::French);
        assert_eq!(
            fr.tokens("panique"),
            vec![Stemmer::create(Algorithm::French).stem("panique").into_owned()]
        );
    }

    #[test]
    fn german_and_french_stemmers_are_used_for_their_libraries() {
        let de = analyzer(Language::German);
        assert_eq!(de.tokens("Straßenbahnen"), de.tokens("Straßenbahn"));
        let fr = analyzer(Language::French);
        assert_eq!(fr.tokens("marées"), fr.tokens("marée"));
    }

    #[test]
    fn cjk_runs_become_bigrams() {
        let sentence = en("東京の地下鉄は便利です。");
        for q in ["東京", "地下鉄", "便利"] {
            for t in en(q) {
                assert!(sentence.contains(&t), "{q}: {t} in {sentence:?}");
            }
        }
        assert_eq!(en("東").len(), 1, "a lone character is a unigram");
        assert_eq!(en("東京タワー tokyo").last().unwrap(), "tokyo");
    }

    #[test]
    fn tokens_are_single_index_terms() {
        for t in en("Grüße, naïve 中文 foo-bar x_y Ωμέγα") {
            assert!(t.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()), "{t}");
            assert!(t.len() <= MAX_TOKEN);
        }
    }

    /// A fuzz find: combining marks that count as letters, ligatures, the
    /// Kelvin sign, dotted capital I — no empty token in any language.
    #[test]
    fn no_token_is_ever_empty() {
        let text = "Grüße naïve 中文 İstanbul K \u{5c5} ﬁ ß \u{93f}\u{940} \u{903}";
        for (lang, _) in LANGUAGES {
            for t in analyzer(*lang).tokens(text) {
                assert!(!t.is_empty() && t.len() <= MAX_TOKEN, "{lang:?}: {t:?}");
                assert!(
                    t.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                    "{lang:?}: {t:?}"
                );
            }
        }
    }

    #[test]
    fn a_clear_language_is_detected_and_a_short_query_guessed() {
        assert_eq!(
            detect("Die Straßenbahn in Wien fährt auf einem der größten Netze der Welt, mit vielen Linien."),
            Some(Language::German)
        );
        assert_eq!(
            detect("Le métro de Paris transporte chaque jour des millions de voyageurs dans la ville."),
            Some(Language::French)
        );
        assert_eq!(guess("Wie kühlt man eine Brandwunde richtig?"), Some(Language::German));
        assert_eq!(detect("Straßenbahnen"), None, "one word says no language clearly");
    }

    #[test]
    fn query_terms_of_two_languages_hold_both_stems() {
        let (en, de) = (analyzer(Language::English), analyzer(Language::German));
        let both = query_terms(&[en, de], "Straßenbahnen", 64);
        assert!(both.contains(&de.tokens("Straßenbahn")[0]), "{both:?}");
        assert!(both.contains(&en.tokens("Straßenbahnen")[0]), "{both:?}");
        assert!(
            query_terms(&[en, de], "die Straßenbahn", 64).len() <= 2,
            "die is a German stop word"
        );
    }

    /// German and French question words, modal forms and contractions are
    /// stop words as English's are (issue 51: a same-language question's
    /// `Warum` or `Pourquoi` weighed most, and its answer lacked it).
    #[test]
    fn german_and_french_question_words_are_stop_words_as_english_ones_are() {
        let (en, de, fr) = (
            analyzer(Language::English),
            analyzer(Language::German),
            analyzer(Language::French),
        );
        for (lang, question, content) in [
            (de, "Warum werden Roggenteige nicht geknetet?", "Roggenteige geknetet"),
            (
                de,
                "Wann knacken die Kaffeebohnen beim Rösten?",
                "knacken Kaffeebohnen Rösten",
            ),
            (
                de,
                "Womit werden Königinnenlarven gefüttert?",
                "Königinnenlarven gefüttert",
            ),
            (
                fr,
                "Pourquoi faut-il traverser le Grand Couloir tôt ?",
                "traverser Grand Couloir tôt",
            ),
            (
                fr,
                "Combien de temps un CDN conserve une réponse ?",
                "temps CDN conserve réponse",
            ),
            (
                fr,
                "Quelle ligne du métro était la première automatique ?",
                "ligne métro première automatique",
            ),
            (fr, "Comment composter sans jardin ?", "composter sans jardin"),
        ] {
            assert_eq!(
                query_terms(&[en, lang], question, 64),
                query_terms(&[en, lang], content, 64),
                "{question}"
            );
        }
        // Alone, a question word is still searched; and never in an English
        // query read as English alone.
        assert_eq!(de.query_terms("Warum", 64), de.tokens("warum"));
        assert_eq!(en.query_terms("comment threads", 64).len(), 2);
    }

    #[test]
    fn a_short_query_is_guessed_by_its_stop_words_when_whatlang_is_unsure() {
        // whatlang alone: Dutch, Danish.
        assert_eq!(guess("Warum braucht Roggenbrot Sauerteig?"), Some(Language::German));
        assert_eq!(
            guess("Warum gibt es zweimal im Monat Springfluten und Nippfluten?"),
            Some(Language::German)
        );
        // English function words outweigh the one Portuguese `do`.
        assert_eq!(guess("how do I renew my passport"), Some(Language::English));
        // A clear guess stands; no stop word, no change.
        assert_eq!(guess("Wie kühlt man eine Brandwunde richtig?"), Some(Language::German));
        assert_eq!(guess("métros automatisés"), Some(Language::French));
    }

    #[test]
    fn query_terms_drop_stop_words_unless_nothing_else_is_left() {
        let a = analyzer(Language::English);
        assert_eq!(
            a.query_terms("what to put on a scald from boiling water", 64),
            a.query_terms("put scald boiling water", 64)
        );
        assert_eq!(a.query_terms("The Who", 64), a.tokens("the who"));
        assert_eq!(a.query_terms("Tidal tidal TIDAL", 64).len(), 1);
        assert!(a.query_terms("* ? \\ ()", 64).is_empty());
    }
}
