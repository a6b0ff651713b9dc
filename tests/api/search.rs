//! Keyword search (DESIGN §5): language analysis (folding, stemming, CJK
//! bigrams, titles), ranking that depends on a tenant's own libraries only,
//! `min_relevance`, library languages, and `migrate`'s re-index of chunks an
//! older analysis indexed.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use mnemosyne::analysis::scoped::{library_key, title_key, ANALYSIS_VERSION};

use crate::helpers::{send, McpClient, TestApp};

/// (title, text) of library A's documents.
pub(crate) const DOCS: &[(&str, &str)] = &[
    (
        "Zürich Tram Guide",
        "Zürich has a dense tram network. The Straßenbahn runs every few minutes, and tickets are \
         valid on buses and on the boats of the lake.",
    ),
    (
        "Bay of Fundy",
        "The tides in the bay rise and fall by sixteen metres twice a day. Fishermen plan their \
         work around the tides.",
    ),
    (
        "Tokyo Transit",
        "東京の地下鉄は便利です。 Trains run from early morning until midnight, and the city is easy \
         to travel around.",
    ),
    (
        "Bakery Visit",
        "Anna Müller bakes bread every morning. Her shop is the best way to start a day in the old town.",
    ),
    (
        "City Walks",
        "The best way to see a city is on foot. Walk around the old town, travel light and take the \
         tram when you are tired.",
    ),
    (
        "Harbour Notes",
        "The harbour fills at high water and empties at low water. Boats wait for the tide at the \
         outer wall, where the pilots meet them. Cargo ships need the spring tides to reach the \
         inner docks; smaller boats come and go at any time of day. In winter the harbour master \
         posts the tide tables on the door of the old customs house, beside the timetable of the \
         ferry that crosses the bay twice a day.",
    ),
    (
        "Garden Diary",
        "Tomatoes need sun and water. Prune the roses in early spring and cover the beds before the frost.",
    ),
];

/// The isolation test's questions: a common-word question, a folded word, a
/// stemmed variant, a word only a title holds, Japanese inside a sentence,
/// and a few words at once.
pub(crate) const QUERIES: &[&str] = &[
    "What is the best way to travel around the city?",
    "zurich",
    "tide",
    "fundy",
    "地下鉄",
    "tram tickets strassenbahn",
];

/// Ingests `DOCS` into `lib`; returns their item uids in order.
pub(crate) async fn ingest_docs(app: &TestApp, lib: &str) -> Vec<String> {
    let mut items = Vec::new();
    for (title, text) in DOCS {
        let out = app
            .ingest(json!({"library_uid": lib, "item": {"title": title}, "content": text}))
            .await;
        items.push(out["item_uid"].as_str().unwrap().to_owned());
    }
    items
}

/// The item uid of the document titled `title`.
fn item_of(items: &[String], title: &str) -> String {
    let i = DOCS.iter().position(|(t, _)| *t == title).unwrap();
    items[i].clone()
}

/// `search` results (limit 10 unless `extra` says otherwise).
pub(crate) async fn search(c: &mut McpClient, query: &str, extra: Value) -> Vec<Value> {
    let mut args = json!({"query": query, "limit": 10});
    for (k, v) in extra.as_object().unwrap() {
        args[k] = v.clone();
    }
    let out = c.call_ok("search", args).await;
    out["results"].as_array().unwrap().clone()
}

/// The item uids of the results, best first.
pub(crate) fn items_of(hits: &[Value]) -> Vec<String> {
    hits.iter()
        .map(|h| h["item_uid"].as_str().unwrap().to_owned())
        .collect()
}

/// (chunk uid, score bits) of the results, best first.
pub(crate) fn ranking(hits: &[Value]) -> Vec<(String, u64)> {
    hits.iter()
        .map(|h| {
            (
                h["chunk_uid"].as_str().unwrap().to_owned(),
                h["score"].as_f64().unwrap().to_bits(),
            )
        })
        .collect()
}

/// A deterministic pseudo-random sequence (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Noise sharing the queries' words and many common ones, 1 to 150 words long.
fn noise(rng: &mut Rng) -> (String, String) {
    const WORDS: &str = "the best way to travel around city is a of and in Zürich zurich tide tides Fundy fundy \
        地下鉄 東京の地下鉄 tram trams tickets Straßenbahn strassenbahn Müller bay boats harbour morning walk old \
        town what water day twice lake bread train trains";
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let len = match rng.next(4) {
        0 => 1 + rng.next(4),
        1 => 5 + rng.next(20),
        2 => 25 + rng.next(50),
        _ => 75 + rng.next(75),
    };
    let text: Vec<&str> = (0..len).map(|_| words[rng.next(words.len())]).collect();
    let title: Vec<&str> = (0..1 + rng.next(3)).map(|_| words[rng.next(words.len())]).collect();
    (title.join(" "), text.join(" "))
}

#[tokio::test]
async fn a_tenants_ranking_does_not_move_when_other_libraries_grow() {
    let app = TestApp::spawn().await;
    let a = app.library("a").await;
    ingest_docs(&app, &a).await;
    let token = app.opaque_token(&[a.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let mut before = Vec::new();
    for q in QUERIES {
        let hits = search(&mut c, q, json!({})).await;
        assert!(!hits.is_empty(), "{q}: nothing found");
        assert!(hits.iter().all(|h| h["library_uid"] == a.as_str()), "{q}: {hits:?}");
        before.push(ranking(&hits));
    }
    // 300 chunks in two other libraries, sharing the queries' words and the
    // common ones, of very different lengths.
    let (b, cc) = (app.library("b").await, app.library("c").await);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let docs: Vec<(String, String, String)> = (0..300)
        .map(|i| {
            let (title, text) = noise(&mut rng);
            (if i % 2 == 0 { b.clone() } else { cc.clone() }, title, text)
        })
        .collect();
    for batch in docs.chunks(10) {
        futures::future::join_all(batch.iter().map(|(lib, title, text)| {
            app.ingest(json!({"library_uid": lib, "item": {"title": title}, "content": text}))
        }))
        .await;
    }
    // The noise is there and searchable by its own tenant.
    let noisy = app.opaque_token(&[b.clone(), cc.clone()]).await;
    let mut n = app.mcp(&noisy).connect().await;
    for q in QUERIES {
        assert_eq!(search(&mut n, q, json!({})).await.len(), 10, "{q}: noise not indexed");
    }
    // The same replica (A's statistics cached: A did not change) and a fresh
    // one (every statistic read anew from the grown graph).
    let fresh = app.second_instance().await;
    let mut f = fresh.mcp(&token).connect().await;
    for (q, was) in QUERIES.iter().zip(&before) {
        let now = ranking(&search(&mut c, q, json!({})).await);
        assert_eq!(&now, was, "{q}: A's results moved when B and C grew");
        let now = ranking(&search(&mut f, q, json!({})).await);
        assert_eq!(&now, was, "{q}: A's results moved when B and C grew (fresh replica)");
    }
}

#[tokio::test]
async fn folding_stemming_titles_and_cjk_find_their_documents() {
    let app = TestApp::spawn().await;
    let a = app.library("a").await;
    let items = ingest_docs(&app, &a).await;
    let token = app.opaque_token(&[a.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    for (query, title) in [
        ("zurich", "Zürich Tram Guide"),
        ("ZÜRICH", "Zürich Tram Guide"),
        ("strassenbahn", "Zürich Tram Guide"),
        ("MULLER", "Bakery Visit"),
        ("tide", "Bay of Fundy"),
        ("fundy", "Bay of Fundy"),
        ("地下鉄", "Tokyo Transit"),
        ("東京", "Tokyo Transit"),
    ] {
        let found = items_of(&search(&mut c, query, json!({})).await);
        assert_eq!(
            found.first(),
            Some(&item_of(&items, title)),
            "{query} → {title}: {found:?}"
        );
    }
    // "tide" found "tides" (the only form in Bay of Fundy's text), and finds
    // both forms: the short text saying "tides" twice ranks above the long one.
    assert!(!DOCS[1].1.contains("tide "));
    let tide = items_of(&search(&mut c, "tide", json!({})).await);
    assert_eq!(tide.len(), 2, "{tide:?}");
    assert!(tide.contains(&item_of(&items, "Harbour Notes")), "{tide:?}");
    // The title-only word is in no text: only the title can have found it.
    assert!(DOCS.iter().all(|(_, text)| !text.to_lowercase().contains("fundy")));
    let fundy = search(&mut c, "fundy", json!({})).await;
    assert_eq!(fundy.len(), 1, "{fundy:?}");
    assert_eq!(fundy[0]["item_title"], "Bay of Fundy");
}

#[tokio::test]
async fn min_relevance_drops_off_topic_questions_and_keeps_answers() {
    let app = TestApp::spawn().await;
    let a = app.library("a").await;
    let items = ingest_docs(&app, &a).await;
    let token = app.opaque_token(&[a.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    // Off topic: only "old town" matches anything here.
    let off = "How much does a bicycle repair cost in the old town?";
    let weak = search(&mut c, off, json!({})).await;
    assert!(!weak.is_empty(), "common words match at min_relevance 0");
    assert!(weak.iter().all(|h| h["relevance"].as_f64().unwrap() < 0.5), "{weak:?}");
    assert_eq!(
        search(&mut c, off, json!({"min_relevance": 0.5})).await,
        Vec::<Value>::new()
    );
    let on = search(
        &mut c,
        "When do the tides rise in the Bay of Fundy?",
        json!({"min_relevance": 0.5}),
    )
    .await;
    assert_eq!(items_of(&on).first(), Some(&item_of(&items, "Bay of Fundy")), "{on:?}");
    assert!(on[0]["relevance"].as_f64().unwrap() >= 0.5);
}

#[tokio::test]
async fn a_german_library_stems_german() {
    let app = TestApp::spawn().await;
    let (status, body) = send(
        app.service(Method::POST, "/library/api/libraries/")
            .json(&json!({"uid": app.uid("de"), "name": "Verkehr", "language": "de"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["language"], "de");
    let de = body["uid"].as_str().unwrap().to_owned();
    let en = app.library("en").await;
    // Too short for its language to be detected: analyzed in the library's.
    let text = "Straßenbahnen";
    // Clearly German: analyzed as German in either library.
    let sentence = "Die Straßenbahnen fahren alle zehn Minuten über die Brücke.";
    for lib in [&de, &en] {
        app.ingest(json!({"library_uid": lib, "item": {"title": "Linien"}, "content": text}))
            .await;
        app.ingest(json!({"library_uid": lib, "item": {"title": "Fahrplan"}, "content": sentence}))
            .await;
    }
    let token = app.opaque_token(&[de.clone(), en.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let hits = search(&mut c, "Straßenbahn", json!({})).await;
    // German stemming joins the plural; English stemming does not.
    let found = |lib: &str, title: &str| hits.iter().any(|h| h["library_uid"] == lib && h["item_title"] == title);
    assert!(found(&de, "Linien") && found(&de, "Fahrplan"), "{hits:?}");
    assert!(found(&en, "Fahrplan"), "a German page in an English library: {hits:?}");
    assert!(!found(&en, "Linien"), "English stemming keeps the plural: {hits:?}");
    assert_eq!(hits.len(), 3, "{hits:?}");
    // The exact (folded) form finds the short page in both libraries.
    let exact = search(&mut c, "strassenbahnen", json!({})).await;
    for lib in [&de, &en] {
        assert!(
            exact
                .iter()
                .any(|h| h["library_uid"] == lib.as_str() && h["item_title"] == "Linien"),
            "{exact:?}"
        );
    }
}

/// English inflections spelled two ways meet (issue 51): Snowball leaves
/// "Dialling" as `diall` and "panicking" as `panick`, so `dialing` and
/// `panic` found nothing in keyword mode; British and American -ise/-ize did
/// not meet either.
#[tokio::test]
async fn english_inflections_spelled_two_ways_find_each_other_in_keyword_mode() {
    let app = TestApp::spawn().await;
    let lib = app.library("spelling").await;
    let mut items = Vec::new();
    for (title, text) in [
        ("Espresso Notes", "Dialling in a new bag of beans takes a few shots."),
        (
            "Rust Errors",
            "A thread that is panicking unwinds its stack by default.",
        ),
        ("Team Handbook", "The shared files are organised by project."),
        ("Garden Diary", "Tomatoes need sun and water."),
    ] {
        let out = app
            .ingest(json!({"library_uid": lib, "item": {"title": title}, "content": text}))
            .await;
        items.push(out["item_uid"].as_str().unwrap().to_owned());
    }
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    for (query, doc) in [
        ("dialing", 0),
        ("dial", 0),
        ("dialed in", 0),
        ("panic", 1),
        ("panicked", 1),
        ("organize", 2),
        ("organizing files", 2),
    ] {
        let hits = search(&mut c, query, json!({"mode": "keyword"})).await;
        assert_eq!(items_of(&hits), [items[doc].clone()], "{query}: {hits:?}");
        assert_eq!(
            hits[0]["relevance"].as_f64(),
            Some(1.0),
            "{query}: the whole query matches"
        );
    }
}

/// A German or French question's question words are stop words, as
/// English's are (issue 51): kept, `Warum` was a word the library barely
/// holds (one title here), so it weighed most, the page that answers lacked
/// it, and its relevance fell below what hybrid's threshold reads as an
/// answer. The question whatlang reads as Dutch is read as German.
#[tokio::test]
async fn german_and_french_questions_match_their_answer_whole() {
    let app = TestApp::spawn().await;
    let lib = app.library("questions").await;
    let mut items = Vec::new();
    for (title, text) in [
        (
            "Roggenbrot",
            "Reines Roggenbrot braucht Sauerteig: es lässt sich nicht wie Weizenbrot mit Hefe allein \
             backen. Roggenteige werden nicht geknetet, sondern nur kurz gemischt.",
        ),
        (
            "Warum zu viele Indizes schaden",
            "Jeder Index beschleunigt bestimmte Abfragen, kostet aber bei jedem Schreiben zusätzliche Arbeit.",
        ),
        (
            "Le mont Blanc",
            "Les alpinistes doivent traverser le Grand Couloir tôt le matin, rapidement et sans s'arrêter, \
             à cause des chutes de pierres.",
        ),
        (
            "Pourquoi composter",
            "Le compost nourrit le sol du jardin et réduit les déchets de la cuisine.",
        ),
    ] {
        let out = app
            .ingest(json!({"library_uid": lib, "item": {"title": title}, "content": text}))
            .await;
        items.push(out["item_uid"].as_str().unwrap().to_owned());
    }
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    for (question, answer) in [
        ("Warum werden Roggenteige nicht geknetet?", 0),
        ("Warum braucht Roggenbrot Sauerteig?", 0),
        ("Pourquoi faut-il traverser le Grand Couloir tôt le matin ?", 2),
    ] {
        let hits = search(&mut c, question, json!({"mode": "keyword"})).await;
        assert_eq!(items_of(&hits).first(), Some(&items[answer]), "{question}: {hits:?}");
        assert_eq!(hits[0]["relevance"].as_f64(), Some(1.0), "{question}: {hits:?}");
    }
}

#[tokio::test]
async fn an_unknown_library_language_is_400_naming_language() {
    let app = TestApp::spawn().await;
    let (status, body) = send(
        app.service(Method::POST, "/library/api/libraries/")
            .json(&json!({"uid": app.uid("xx"), "name": "X", "language": "xx"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["field"], "language", "{body}");
    assert!(app.state.admin.find_library(&app.uid("xx")).await.unwrap().is_none());
}

// ---- migrate's re-index ----

/// A chunk's `scoped` as it was written before analysis version 2: words
/// lower-cased, non-ASCII words hex-encoded, no folding, no stemming, no
/// title terms.
fn old_scoped(library_uid: &str, text: &str) -> String {
    let key = library_key(library_uid);
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let lower = w.to_lowercase();
            let word = if lower.bytes().all(|b| b.is_ascii_alphanumeric()) {
                lower
            } else {
                format!("x{}", hex::encode(lower.as_bytes()))
            };
            format!("{key}_{word}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn graph_rows(app: &TestApp, q: neo4rs::Query) -> Vec<neo4rs::Row> {
    app.state.admin.rows_for_tests(q).await.expect("graph query")
}

/// (analysis, dl) of a chunk.
async fn chunk_index(app: &TestApp, uid: &str) -> (Option<i64>, Option<i64>) {
    let rows = graph_rows(
        app,
        neo4rs::query("MATCH (c:Chunk {uid: $uid}) RETURN c.analysis AS analysis, c.dl AS dl").param("uid", uid),
    )
    .await;
    (rows[0].get("analysis").unwrap(), rows[0].get("dl").unwrap())
}

async fn reindex(app: &TestApp) -> (i64, String) {
    let mut out = Vec::new();
    let n = mnemosyne::cli::reindex::run(&app.state.admin, &mut out)
        .await
        .expect("re-index");
    (n, String::from_utf8(out).unwrap())
}

/// The two re-index tests of this file re-index the whole shared graph:
/// one at a time (each would re-index the other's chunk and record it in its
/// own database only).
static REINDEXING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn migrate_reindexes_chunks_an_older_analysis_indexed_and_then_writes_nothing() {
    let _alone = REINDEXING.lock().await;
    let app = TestApp::spawn().await;
    let (title, content) = ("Alpine Railways", "Trains climb to Zürich through the long tunnels.");
    // The same document ingested today, for comparison.
    let fresh = app.library("fresh").await;
    app.ingest(json!({"library_uid": fresh, "item": {"title": title}, "content": content}))
        .await;
    let rows = graph_rows(
        &app,
        neo4rs::query("MATCH (c:Chunk {library_uid: $lib}) RETURN c.text AS text, c.dl AS dl")
            .param("lib", fresh.as_str()),
    )
    .await;
    let (text, fresh_dl): (String, i64) = (rows[0].get("text").unwrap(), rows[0].get("dl").unwrap());
    // A chunk written the old way: old `scoped`, no `dl`, no `analysis`.
    let old = app.library("old").await;
    let uid = app.uid("chk_old");
    graph_rows(
        &app,
        neo4rs::query(
            "CREATE (c:Chunk {uid: $uid, library_uid: $lib, collection_uid: $col, item_uid: $item, \
             item_title: $title, ordinal: 0, text: $text, scoped: $scoped})",
        )
        .param("uid", uid.as_str())
        .param("lib", old.as_str())
        .param("col", app.uid("col_old"))
        .param("item", app.uid("item_old"))
        .param("title", title)
        .param("text", text.as_str())
        .param("scoped", old_scoped(&old, &text)),
    )
    .await;
    let token = app.opaque_token(&[old.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let before = [
        search(&mut c, "zurich", json!({})).await,
        search(&mut c, "alpine", json!({})).await,
        search(&mut c, "tunnel", json!({})).await,
    ];
    // A word both analyses write alike finds it either way.
    assert_eq!(
        items_of(&search(&mut c, "climb", json!({})).await),
        [app.uid("item_old")]
    );
    // Another test's `migrate` may re-index it at any time; until one does,
    // the folded word, the title and the stem find nothing.
    if chunk_index(&app, &uid).await.0.is_none() {
        for hits in &before {
            assert!(hits.is_empty(), "found before the re-index: {hits:?}");
        }
    }

    // A `migrate` of another test's database (sessions.rs runs one) may have
    // re-indexed the chunk already, recording it in that database only: it
    // is recorded here, as this deployment's own migrate would have.
    if chunk_index(&app, &uid).await.0 == Some(ANALYSIS_VERSION) {
        let seq = mnemosyne::store::pg::index_changes::record(&app.pg, &old, None)
            .await
            .unwrap();
        for _ in 0..200 {
            let heard = app.state.auth.caches.index.get(std::slice::from_ref(&old));
            if heard.and_then(|h| h.get(&old).copied()).is_some_and(|s| s >= seq) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    let (_, printed) = reindex(&app).await;
    assert!(
        printed.ends_with("chunks re-indexed)\n") || printed == "search index up to date\n",
        "{printed}"
    );
    assert_eq!(chunk_index(&app, &uid).await, (Some(ANALYSIS_VERSION), Some(fresh_dl)));
    for q in ["zurich", "alpine", "tunnel"] {
        let hits = search(&mut c, q, json!({})).await;
        assert_eq!(hits.len(), 1, "{q}: {hits:?}");
        assert_eq!(hits[0]["chunk_uid"], uid.as_str(), "{q}");
    }
    // Ranked exactly as the same chunk ingested today: its length now counts
    // in its library's statistics (read anew here by a replica that has not
    // cached them; a running one reads them again when its cache expires).
    let replica = app.second_instance().await;
    let mut r = replica.mcp(&token).connect().await;
    let mut f = app.mcp(&app.opaque_token(&[fresh.clone()]).await).connect().await;
    let q = "zurich alpine tunnels trains";
    let (was_old, was_fresh) = (search(&mut r, q, json!({})).await, search(&mut f, q, json!({})).await);
    assert_eq!(was_old[0]["score"].as_f64(), was_fresh[0]["score"].as_f64());
    assert_eq!(was_old[0]["relevance"].as_f64(), was_fresh[0]["relevance"].as_f64());

    // Nothing of this test is stale any more. The graph is shared with tests
    // running in parallel (one may have just written an old-style chunk of
    // its own), so the whole-graph answer is one line only when it is quiet.
    let (_, again) = reindex(&app).await;
    assert!(
        again == "search index up to date\n" || again.ends_with("chunks re-indexed)\n"),
        "{again}"
    );
    assert_eq!(chunk_index(&app, &uid).await, (Some(ANALYSIS_VERSION), Some(fresh_dl)));
}

/// A chunk analysis 3 indexed (English stems as Snowball left them:
/// "Dialling" as `diall`) is stale: `migrate` re-indexes it, and `dialing`
/// finds it after.
#[tokio::test]
async fn migrate_reindexes_chunks_indexed_before_english_stems_were_respelled() {
    let _alone = REINDEXING.lock().await;
    let app = TestApp::spawn().await;
    let lib = app.library("v3").await;
    let uid = app.uid("chk_v3");
    let (key, tkey) = (library_key(&lib), title_key(&lib));
    graph_rows(
        &app,
        neo4rs::query(
            "CREATE (c:Chunk {uid: $uid, library_uid: $lib, collection_uid: $col, item_uid: $item, \
             item_title: $title, ordinal: 0, text: $text, scoped: $scoped, dl: 3, analysis: 3})",
        )
        .param("uid", uid.as_str())
        .param("lib", lib.as_str())
        .param("col", app.uid("col_v3"))
        .param("item", app.uid("item_v3"))
        .param("title", "Espresso Notes")
        .param("text", "Dialling in espresso")
        .param(
            "scoped",
            format!("{key}_diall {key}_in {key}_espresso {tkey}_espresso {tkey}_note"),
        ),
    )
    .await;
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    // Another test's `migrate` may re-index it at any time; until one does,
    // the other spelling finds nothing. (Searched first, checked after: a
    // re-index between a check and the search would look like a find.)
    let before = search(&mut c, "dialing", json!({})).await;
    if chunk_index(&app, &uid).await.0 == Some(3) {
        assert_eq!(before, Vec::<Value>::new());
    }
    reindex(&app).await;
    assert_eq!(chunk_index(&app, &uid).await, (Some(ANALYSIS_VERSION), Some(3)));
    // When another test's `migrate` re-indexed the chunk first, this one
    // found nothing to do, and that one may not have recorded the change for
    // the replica's index yet: its record is awaited (at most 5 s).
    let mut hits = Vec::new();
    for _ in 0..50 {
        hits = search(&mut c, "dialing", json!({})).await;
        if !hits.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0]["chunk_uid"], uid.as_str());
}

/// A newer analysis's chunks are not an older binary's to re-index: during
/// a rolling upgrade (or beside a checkout of another version on one graph)
/// the older `migrate` leaves them as the newer one wrote them.
#[tokio::test]
async fn migrate_leaves_chunks_a_newer_analysis_indexed_as_they_are() {
    let app = TestApp::spawn().await;
    let lib = app.library("newer").await;
    let uid = app.uid("chk_newer");
    let newer = ANALYSIS_VERSION + 1;
    graph_rows(
        &app,
        neo4rs::query(
            "CREATE (c:Chunk {uid: $uid, library_uid: $lib, collection_uid: $col, item_uid: $item, \
             item_title: 'Newer', ordinal: 0, text: 'written by a newer analysis', scoped: 'as the newer wrote it', \
             dl: 7, analysis: $analysis})",
        )
        .param("uid", uid.as_str())
        .param("lib", lib.as_str())
        .param("col", app.uid("col_newer"))
        .param("item", app.uid("item_newer"))
        .param("analysis", newer),
    )
    .await;
    reindex(&app).await;
    assert_eq!(chunk_index(&app, &uid).await, (Some(newer), Some(7)));
    let rows = graph_rows(
        &app,
        neo4rs::query("MATCH (c:Chunk {uid: $uid}) RETURN c.scoped AS scoped").param("uid", uid.as_str()),
    )
    .await;
    assert_eq!(rows[0].get::<String>("scoped").unwrap(), "as the newer wrote it");
}
