//! Writes (ingest, workspace lifecycle) and operator reads that are not scoped
//! by a bearer: methods of `AdminGraph`, which only the Basic-authenticated
//! APIs, the admin console, the CLI and the embedding worker hold
//! (`GraphStore::into_handles`).
//! Multi-statement writes run in one explicit transaction: all or nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{SecondsFormat, Utc};
use neo4rs::{query, BoltType};
use sha2::{Digest, Sha256};

use super::{GraphError, GraphStore, Known, Step, Txn};
use crate::analysis::Language;
use crate::store::pg::index_changes::Pending;

/// A workspace's library as the workspace API publishes it (`library` of
/// `GET …/workspaces/{id}/`): a wire shape, kept apart from the admin
/// projection `admin::LibraryDetail` — its chunk count is counted over the
/// chunks, and its fields are what clients read.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkspaceLibrary {
    pub uid: String,
    pub name: String,
    pub collection_count: i64,
    pub item_count: i64,
    pub chunk_count: i64,
}

#[derive(Clone, Debug)]
pub struct ExistingItem {
    pub library_uid: String,
    pub collection_uid: String,
    pub content_sha256: Option<String>,
    pub chunk_count: i64,
    pub title: String,
    pub source_uri: Option<String>,
    pub mime_type: Option<String>,
}

impl ExistingItem {
    /// None when the item was deleted between the match and the property
    /// reads (Neo4j then reads its properties as null): it is gone.
    fn from_row(r: &neo4rs::Row) -> Result<Option<Self>, GraphError> {
        let Some(library_uid) = r.get::<Option<String>>("library_uid")? else {
            return Ok(None);
        };
        let Some(collection_uid) = r.get::<Option<String>>("collection_uid")? else {
            return Ok(None);
        };
        Ok(Some(ExistingItem {
            library_uid,
            collection_uid,
            content_sha256: r.get("content_sha256")?,
            chunk_count: r.get::<Option<i64>>("chunk_count")?.unwrap_or(0),
            title: r.get::<Option<String>>("title")?.unwrap_or_default(),
            source_uri: r.get("source_uri")?,
            mime_type: r.get("mime_type")?,
        }))
    }

    /// True when writing `w` would change nothing.
    pub fn unchanged_by(&self, w: &ItemWrite<'_>) -> bool {
        self.library_uid == w.library_uid
            && self.collection_uid == w.collection_uid
            && self.content_sha256.as_deref() == Some(w.content_sha256)
            && self.title == w.title
            && self.source_uri.as_deref() == w.source_uri
            && self.mime_type.as_deref() == w.mime_type
    }
}

/// What to write for one item.
pub struct ItemWrite<'a> {
    pub uid: &'a str,
    pub library_uid: &'a str,
    /// The workspace the library must (still) belong to; None for a
    /// user-managed library.
    pub workspace_id: Option<&'a str>,
    pub collection_uid: &'a str,
    pub title: &'a str,
    pub source_uri: Option<&'a str>,
    pub mime_type: Option<&'a str>,
    pub content_sha256: &'a str,
    pub chunks: &'a [String],
}

/// Why an item delete stopped: the item went, or it is now another
/// library's (deleted and re-ingested there meanwhile).
enum Moved {
    Gone,
    Elsewhere,
}

/// How an item write ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemOutcome {
    /// Written; `replaced` when the item existed before.
    Written { replaced: bool },
    /// Same content and metadata: nothing was written.
    Unchanged { chunk_count: i64 },
    /// The item uid belongs to another library: nothing was written.
    OtherLibrary,
    /// The library (its fence) is gone or being deleted — a delete raced this
    /// ingest: nothing was written.
    LibraryGone,
}

/// Fences per library. Every item write updates one of its library's fences
/// (chosen by the item uid) inside its transaction, and a library delete
/// removes all of them in the transaction that removes the Library: a write
/// racing the delete then conflicts (ArcadeDB) or waits on the fence's lock
/// (Neo4j) instead of leaving orphans. Concurrent ingests into one library
/// conflict with each other only when their items share a fence.
pub const FENCES: u32 = 256;

/// Largest Bolt message (bytes, estimated) the chunk statements are cut to.
/// neo4rs writes through an 8 KiB buffer without TCP_NODELAY: a larger
/// message goes out as a tiny segment plus the rest, and Nagle's algorithm
/// holds the rest until the server's delayed ACK (~40 ms on Linux). Several
/// statements under the buffer size cost a round trip each instead.
pub const MAX_MESSAGE_BYTES: usize = 7_000;

/// Groups (estimated size, value) pairs into lists of at most
/// `MAX_MESSAGE_BYTES` (a single larger value gets a list of its own).
pub fn message_batches(items: Vec<(usize, BoltType)>) -> Vec<Vec<BoltType>> {
    let mut out: Vec<Vec<BoltType>> = Vec::new();
    let mut size = 0;
    for (n, v) in items {
        match out.last_mut() {
            Some(last) if size + n <= MAX_MESSAGE_BYTES => {
                last.push(v);
                size += n;
            }
            _ => {
                out.push(vec![v]);
                size = n;
            }
        }
    }
    out
}

/// The fence uids of a library.
pub fn fence_uids(library_uid: &str) -> Vec<String> {
    (0..FENCES).map(|k| format!("{library_uid}#{k}")).collect()
}

/// The fence an item's writes go through.
pub fn fence_of(library_uid: &str, item_uid: &str) -> String {
    let h = Sha256::digest(item_uid.as_bytes());
    let k = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) % FENCES;
    format!("{library_uid}#{k}")
}

/// `prefix_` + 24 hex chars of SHA-256 over the parts: deterministic uids, so
/// find-or-create is a MERGE and concurrent ingests converge.
pub fn derived_uid(prefix: &str, parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    format!("{prefix}_{}", &hex::encode(h.finalize())[..24])
}

/// The uid of a workspace's Library: derived from the workspace id, so the
/// same workspace gets the same uid whenever its Library is (re-)created.
pub fn workspace_library_uid(workspace_id: &str) -> String {
    derived_uid("lib", &["workspace", workspace_id])
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn opt(s: Option<&str>) -> BoltType {
    s.map(str::to_owned).into()
}

/// Ingest, workspace lifecycle and operator reads, unscoped: for the
/// Basic-authenticated APIs, the admin console and the CLI — never for a
/// bearer's request.
///
/// Its methods live beside the statements they run: here, ingest and the
/// workspace and library lifecycle (connect, find/create/delete, items);
/// `admin.rs`, the operator reads (library pages, names, lists, details,
/// rename) and `forget_changed`; `reindex.rs`, re-indexing chunks of an
/// older keyword analysis; `vectors.rs`, the embedding worker's reads and
/// writes.
#[derive(Clone)]
pub struct AdminGraph(pub(super) GraphStore);

impl GraphStore {
    /// The unscoped ingest and admin handle (outside `store/`: `into_handles`).
    pub(super) fn admin(&self) -> AdminGraph {
        AdminGraph(self.clone())
    }
}

impl AdminGraph {
    /// Connects straight to the admin handle (the CLI, benches, tests): a
    /// connection of its own, no metrics, no embedding model.
    pub async fn connect(settings: &crate::config::Settings) -> Result<Self, GraphError> {
        Ok(GraphStore::connect(settings).await?.admin())
    }

    /// The library uids of one workspace, uid order, without counting
    /// anything (deleting a workspace).
    pub async fn workspace_library_uids(&self, workspace_id: &str) -> Result<Vec<String>, GraphError> {
        Ok(self
            .0
            .libraries_for_workspaces(&[workspace_id.to_owned()])
            .await?
            .remove(workspace_id)
            .unwrap_or_default())
    }

    /// The transaction runner's counters (transactions, retries, gave up).
    pub fn txn_stats(&self) -> (u64, u64, u64) {
        self.0.txn_stats()
    }

    /// Test inspection only: runs one Cypher statement outside any scope and
    /// returns its rows. The one way past `store/` to a raw statement, for
    /// tests that check what the graph holds; nothing in `src/` calls it
    /// (`src/layering.rs` checks).
    #[doc(hidden)]
    pub async fn rows_for_tests(&self, q: neo4rs::Query) -> Result<Vec<neo4rs::Row>, GraphError> {
        self.0.rows_from_leader("test inspection", q).await
    }
}

/// (workspace id, fenced) of a library, or None if it does not exist.
pub(super) async fn library_state(store: &GraphStore, uid: &str) -> Result<Option<(Option<String>, bool)>, GraphError> {
    let rows = store
        .rows(
            "ingest_find_library.cypher",
            query(include_str!("../../../cypher/ingest_find_library.cypher")).param("uid", uid),
        )
        .await?;
    match rows.first() {
        Some(r) => Ok(Some((
            r.get::<Option<String>>("workspace_id")?,
            r.get::<Option<i64>>("fences")?.is_some(),
        ))),
        None => Ok(None),
    }
}

impl AdminGraph {
    /// The library's workspace id, or None if the library does not exist.
    pub async fn find_library(&self, uid: &str) -> Result<Option<Option<String>>, GraphError> {
        Ok(library_state(&self.0, uid).await?.map(|(ws, _)| ws))
    }

    fn fence_step<A>(uid: &str) -> Step<A> {
        Step::run(
            query(include_str!("../../../cypher/ingest_fence_library.cypher"))
                .param("uid", uid)
                .param("fences", fence_uids(uid)),
        )
    }

    /// Finds or creates the workspace's Library; returns (uid, created), or
    /// None when a Library with that uid exists but is not this workspace's.
    /// The common case (it exists, fenced) is one read and no write; creating
    /// it (with its fences) is one find-or-create transaction, retried when
    /// concurrent first ingests race on it.
    pub async fn ensure_workspace_library(&self, workspace_id: &str) -> Result<Option<(String, bool)>, GraphError> {
        let uid = workspace_library_uid(workspace_id);
        let key = Known::Workspace(workspace_id.to_owned());
        if self.0.known.get(&key).await.is_some() {
            return Ok(Some((uid, false)));
        }
        match library_state(&self.0, &uid).await? {
            Some((ws, _)) if ws.as_deref() != Some(workspace_id) => return Ok(None),
            Some((_, true)) => {
                self.0.known.insert(key, uid.clone()).await;
                return Ok(Some((uid, false)));
            }
            _ => {}
        }
        let ts = now();
        let created = Arc::new(AtomicBool::new(false));
        let flag = created.clone();
        let (ws, stamp) = (workspace_id.to_owned(), ts.clone());
        let steps = vec![
            Step::check(
                query(include_str!("../../../cypher/ingest_merge_workspace_library.cypher"))
                    .param("uid", uid.as_str())
                    .param("workspace_id", workspace_id)
                    .param("name", format!("Workspace {workspace_id}"))
                    .param("description", format!("Files of Daedalus workspace {workspace_id}"))
                    .param("now", ts.as_str()),
                move |rows| {
                    let r = rows
                        .first()
                        .ok_or_else(|| GraphError::Query("MERGE returned no row".into()))?;
                    if r.get::<Option<String>>("workspace_id")?.as_deref() != Some(ws.as_str()) {
                        return Ok(Some(()));
                    }
                    flag.store(
                        r.get::<Option<String>>("created_at")?.as_deref() == Some(stamp.as_str()),
                        Ordering::Relaxed,
                    );
                    Ok(None)
                },
            ),
            Self::fence_step(&uid),
        ];
        match self.0.transaction("ensure workspace library", true, steps).await? {
            Txn::Committed => {
                self.0.known.insert(key, uid.clone()).await;
                Ok(Some((uid, created.load(Ordering::Relaxed))))
            }
            Txn::Stopped(()) => Ok(None),
        }
    }

    /// Gives an existing library its fences if it has none (libraries from
    /// before fences); false if the library does not exist.
    pub async fn ensure_library_fenced(&self, uid: &str) -> Result<bool, GraphError> {
        let key = Known::Library(uid.to_owned());
        if self.0.known.get(&key).await.is_some() {
            return Ok(true);
        }
        let exists = match library_state(&self.0, uid).await? {
            None => false,
            Some((_, true)) => true,
            Some((_, false)) => {
                self.0
                    .transaction::<()>("fence library", true, vec![Self::fence_step(uid)])
                    .await?;
                library_state(&self.0, uid).await?.is_some()
            }
        };
        if exists {
            self.0.known.insert(key, uid.to_owned()).await;
        }
        Ok(exists)
    }

    /// Forgets what `known` says about a library, its workspace and its
    /// collections (an item write found it gone).
    pub async fn forget_library(&self, uid: &str) {
        let uid = uid.to_owned();
        let _ = self
            .0
            .known
            .invalidate_entries_if(move |k, v| *v == uid || k.library() == Some(uid.as_str()));
        self.0.known.run_pending_tasks().await;
    }

    /// Creates a user-managed Library (with its fences); false if the uid is taken.
    /// The language a library's text is analyzed in (set when it was created;
    /// English when none was given). Cached: it never changes.
    pub async fn language_of(&self, uid: &str) -> Result<Language, GraphError> {
        let key = Known::Language(uid.to_owned());
        if let Some(code) = self.0.known.get(&key).await {
            return Ok(Language::of_stored(Some(&code)));
        }
        let rows = self
            .0
            .rows(
                "ingest_find_library.cypher",
                query(include_str!("../../../cypher/ingest_find_library.cypher")).param("uid", uid),
            )
            .await?;
        let Some(r) = rows.first() else {
            return Ok(Language::English);
        };
        let language = Language::of_stored(r.get::<Option<String>>("language")?.as_deref());
        self.0.known.insert(key, language.code().to_owned()).await;
        Ok(language)
    }

    pub async fn create_library(
        &self,
        uid: &str,
        name: &str,
        description: &str,
        language: Language,
    ) -> Result<bool, GraphError> {
        if self.find_library(uid).await?.is_some() {
            return Ok(false);
        }
        match self
            .0
            .transaction::<()>(
                "create library",
                false,
                vec![
                    Step::run(
                        query(include_str!("../../../cypher/create_library.cypher"))
                            .param("uid", uid)
                            .param("name", name)
                            .param("description", description)
                            .param("language", language.code())
                            .param("now", now()),
                    ),
                    Self::fence_step(uid),
                ],
            )
            .await
        {
            Ok(_) => Ok(true),
            // Lost a race on the uniqueness constraint.
            Err(GraphError::Query(m)) if m.contains("ConstraintValidationFailed") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Finds or creates a collection of the library; None when the library
    /// does not exist (any more).
    pub async fn collection_in(&self, library_uid: &str, name: &str) -> Result<Option<String>, GraphError> {
        let uid = derived_uid("col", &[library_uid, name]);
        let key = Known::Collection(uid.clone());
        if self.0.known.get(&key).await.is_some() {
            return Ok(Some(uid));
        }
        let rows = self
            .0
            .rows(
                "ingest_find_collection.cypher",
                query(include_str!("../../../cypher/ingest_find_collection.cypher")).param("uid", uid.as_str()),
            )
            .await?;
        if !rows.is_empty() {
            self.0.known.insert(key, library_uid.to_owned()).await;
            return Ok(Some(uid));
        }
        let steps = vec![Step::check(
            query(include_str!("../../../cypher/ingest_merge_collection.cypher"))
                .param("uid", uid.as_str())
                .param("library_uid", library_uid)
                .param("name", name),
            |rows| Ok(rows.is_empty().then_some(())),
        )];
        match self.0.transaction("ensure collection", true, steps).await? {
            Txn::Committed => {
                self.0.known.insert(key, library_uid.to_owned()).await;
                Ok(Some(uid))
            }
            Txn::Stopped(()) => Ok(None),
        }
    }

    /// `collection_in` for callers that know the library exists.
    pub async fn ensure_collection(&self, library_uid: &str, name: &str) -> Result<String, GraphError> {
        self.collection_in(library_uid, name)
            .await?
            .ok_or_else(|| GraphError::Query(format!("library not found: {library_uid}")))
    }

    pub async fn find_item(&self, uid: &str) -> Result<Option<ExistingItem>, GraphError> {
        let rows = self
            .0
            .rows(
                "ingest_find_item.cypher",
                query(include_str!("../../../cypher/ingest_find_item.cypher")).param("uid", uid),
            )
            .await?;
        Ok(rows.first().map(ExistingItem::from_row).transpose()?.flatten())
    }

    /// Upserts the item and replaces its chunks, in one transaction that
    /// first updates the item's library fence (no fence: the library is gone,
    /// nothing is written) and reads the item (another library's, or the same
    /// content and metadata: nothing is written). Only the item, its chunks
    /// and one fence are written: no shared vertex, so concurrent ingests into
    /// one library rarely conflict, and a conflict is retried by the runner.
    /// Statements: the item read, the fence, the item upsert (which also
    /// deletes the old chunks: they must go after the fence, and apart they
    /// cost a statement, two round trips, per item), and the chunk batches.
    pub async fn write_item(&self, w: &ItemWrite<'_>) -> Result<ItemOutcome, GraphError> {
        if let Some(f) = &self.0.on_item_write {
            f(); // the embedding worker yields to ingest
        }
        let language = self.language_of(w.library_uid).await?;
        let chunks: Vec<(usize, BoltType)> = w
            .chunks
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let uid = derived_uid("chk", &[w.uid, w.content_sha256, &i.to_string()]);
                let indexed = crate::analysis::scoped::scoped_text(w.library_uid, language, w.title, text);
                let size = uid.len() + text.len() + indexed.scoped.len() + 64;
                let mut m: HashMap<String, BoltType> = HashMap::new();
                m.insert("uid".into(), uid.into());
                m.insert("ordinal".into(), (i as i64).into());
                m.insert("text".into(), text.as_str().into());
                m.insert("scoped".into(), indexed.scoped.into());
                m.insert("dl".into(), indexed.dl.into());
                (size, m.into())
            })
            .collect();
        let ts = now();
        let existed = Arc::new(AtomicBool::new(false));
        let seen = existed.clone();
        let (library_uid, collection_uid, sha) = (
            w.library_uid.to_owned(),
            w.collection_uid.to_owned(),
            w.content_sha256.to_owned(),
        );
        let (title, source_uri, mime_type) = (
            w.title.to_owned(),
            w.source_uri.map(str::to_owned),
            w.mime_type.map(str::to_owned),
        );
        let steps = vec![
            Step::check(
                query(include_str!("../../../cypher/ingest_find_item.cypher")).param("uid", w.uid),
                move |rows| {
                    let Some(e) = rows.first().map(ExistingItem::from_row).transpose()?.flatten() else {
                        seen.store(false, Ordering::Relaxed);
                        return Ok(None);
                    };
                    seen.store(true, Ordering::Relaxed);
                    if e.library_uid != library_uid {
                        return Ok(Some(ItemOutcome::OtherLibrary));
                    }
                    let same = ItemWrite {
                        uid: "",
                        library_uid: &library_uid,
                        workspace_id: None,
                        collection_uid: &collection_uid,
                        title: &title,
                        source_uri: source_uri.as_deref(),
                        mime_type: mime_type.as_deref(),
                        content_sha256: &sha,
                        chunks: &[],
                    };
                    Ok(e.unchanged_by(&same).then_some(ItemOutcome::Unchanged {
                        chunk_count: e.chunk_count,
                    }))
                },
            ),
            Step::check(
                query(include_str!("../../../cypher/ingest_touch_fence.cypher"))
                    .param("fence_uid", fence_of(w.library_uid, w.uid))
                    .param("collection_uid", w.collection_uid)
                    .param("workspace_id", w.workspace_id.unwrap_or_default()),
                |rows| {
                    let n: i64 = rows.first().map(|r| r.get("n")).transpose()?.unwrap_or(0);
                    Ok((n == 0).then_some(ItemOutcome::LibraryGone))
                },
            ),
            // The item and, in the same statement, its old chunks: one
            // statement (two round trips) fewer than deleting them apart.
            Step::run(
                query(include_str!("../../../cypher/ingest_replace_item.cypher"))
                    .param("uid", w.uid)
                    .param("library_uid", w.library_uid)
                    .param("collection_uid", w.collection_uid)
                    .param("title", w.title)
                    .param("source_uri", opt(w.source_uri))
                    .param("mime_type", opt(w.mime_type))
                    .param("content_sha256", w.content_sha256)
                    .param("chunk_count", w.chunks.len() as i64)
                    .param("now", ts.as_str()),
            ),
        ];
        let mut steps = steps;
        for batch in message_batches(chunks) {
            steps.push(Step::run(
                query(include_str!("../../../cypher/ingest_create_chunks.cypher"))
                    .param("item_uid", w.uid)
                    .param("library_uid", w.library_uid)
                    .param("collection_uid", w.collection_uid)
                    .param("item_title", w.title)
                    .param("analysis", crate::analysis::scoped::ANALYSIS_VERSION)
                    .param("chunks", batch),
            ));
        }
        // The change is intended before the graph is touched, so that a
        // commit whose record fails (or whose caller gave up) is still
        // recorded: by the retry, or by the sweep.
        let intent = self.0.intend(w.library_uid, Some(w.uid), None).await?;
        // Find-or-create: two first ingests of one uid race on the Item's
        // uniqueness; the loser's next attempt finds the winner's item.
        let outcome = match self.0.transaction("write item", true, steps).await? {
            Txn::Committed => ItemOutcome::Written {
                replaced: existed.load(Ordering::Relaxed),
            },
            Txn::Stopped(outcome) => outcome,
        };
        // Every replica's index sees the write before it is acknowledged. An
        // unchanged re-ingest records too: it is how a client's retry heals a
        // write whose recording failed after its commit.
        if matches!(outcome, ItemOutcome::Written { .. } | ItemOutcome::Unchanged { .. }) {
            self.0.record_intended(intent, w.library_uid, Some(w.uid)).await?;
        } else {
            self.0.forget_intent(intent).await;
        }
        Ok(outcome)
    }

    /// Deletes an item and its chunks in one transaction; false if it did not exist.
    ///
    /// The transaction first updates the item's fence, as every write of the
    /// item does: a re-ingest that committed before is then wholly visible
    /// to the statements that follow (its chunks go too), and one that comes
    /// after waits (Neo4j) or conflicts (ArcadeDB) and finds no item. Without
    /// it, a re-ingest committing between the chunk and the item statements
    /// left chunks without their item.
    pub async fn delete_item(&self, uid: &str) -> Result<bool, GraphError> {
        // The fence depends on the library; an item deleted and re-ingested
        // into another library meanwhile is looked up again (bounded).
        for _ in 0..3 {
            let Some(existing) = self.find_item(uid).await? else {
                // Nothing left: perhaps an earlier attempt deleted it and
                // could not record that (503, and this is the client's
                // retry). Its intent is recorded now, before the answer, so
                // no index serves the item after it.
                self.0.record_pending(Pending::Item(uid)).await?;
                return Ok(false);
            };
            let lib = existing.library_uid;
            let intent = self.0.intend(&lib, Some(uid), None).await?;
            let expected = lib.clone();
            let steps = vec![
                Step::run(
                    query(include_str!("../../../cypher/delete_item_fence.cypher"))
                        .param("fence_uid", fence_of(&lib, uid)),
                ),
                Step::check(
                    query(include_str!("../../../cypher/ingest_find_item.cypher")).param("uid", uid),
                    move |rows| {
                        Ok(match rows.first().map(ExistingItem::from_row).transpose()?.flatten() {
                            None => Some(Moved::Gone),
                            Some(e) if e.library_uid != expected => Some(Moved::Elsewhere),
                            Some(_) => None,
                        })
                    },
                ),
                Step::run(
                    query(include_str!("../../../cypher/delete_item_chunks.cypher"))
                        .param("item_uid", uid)
                        .param("library_uid", lib.as_str()),
                ),
                Step::run(
                    query(include_str!("../../../cypher/delete_item.cypher"))
                        .param("uid", uid)
                        .param("library_uid", lib.as_str()),
                ),
            ];
            match self.0.transaction("delete item", false, steps).await? {
                Txn::Committed => {
                    self.0.record_intended(intent, &lib, Some(uid)).await?;
                    return Ok(true);
                }
                Txn::Stopped(Moved::Gone) => {
                    self.0.forget_intent(intent).await;
                    self.0.record_pending(Pending::Item(uid)).await?;
                    return Ok(false);
                }
                Txn::Stopped(Moved::Elsewhere) => {
                    self.0.forget_intent(intent).await;
                    continue;
                }
            }
        }
        Err(GraphError::Conflict(format!(
            "delete item {uid}: it kept moving between libraries"
        )))
    }

    pub async fn workspace_libraries(&self, workspace_id: &str) -> Result<Vec<WorkspaceLibrary>, GraphError> {
        let rows = self
            .0
            .rows(
                "workspace_libraries.cypher",
                query(include_str!("../../../cypher/workspace_libraries.cypher")).param("workspace_id", workspace_id),
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(WorkspaceLibrary {
                    uid: r.get("uid")?,
                    name: r.get::<Option<String>>("name")?.unwrap_or_default(),
                    collection_count: r.get("collection_count")?,
                    item_count: r.get("item_count")?,
                    chunk_count: r.get("chunk_count")?,
                })
            })
            .collect()
    }

    /// Deletes libraries and everything under them. The libraries are marked
    /// as being deleted (item writes then stop), chunks and items go in
    /// batches (one transaction over a large library exhausts the graph
    /// server); then one transaction removes the fences, whatever children
    /// racing ingests added meanwhile, the collections and the Library. An
    /// ingest racing that transaction has updated a fence it removes, so one
    /// of the two conflicts and runs again: the ingest's children are either
    /// seen and removed, or its next attempt finds no fence and writes
    /// nothing. A re-created library (same uid) therefore inherits nothing.
    /// An interrupted delete leaves the library in place, refusing ingests
    /// (409); running it again finishes it.
    pub async fn delete_libraries(&self, libs: &[String]) -> Result<(), GraphError> {
        self.delete_libraries_of(libs, None).await
    }

    /// `delete_libraries` for the delete of `workspace`, whose libraries
    /// they are: its retry, which finds none left, settles by the workspace
    /// (`settle_workspace_delete`).
    pub async fn delete_libraries_of(&self, libs: &[String], workspace: Option<&str>) -> Result<(), GraphError> {
        if libs.is_empty() {
            return Ok(());
        }
        let mut intents = Vec::with_capacity(libs.len());
        for lib in libs {
            intents.push(self.0.intend(lib, None, workspace).await?);
        }
        let l: BoltType = libs.to_vec().into();
        // Close first: a single write to the Library nodes, which item writes
        // only read, so it commits at once; item writes that start after it
        // write nothing, and the final transaction is not starved by them.
        self.0
            .write_txn(
                "close libraries",
                vec![query(include_str!("../../../cypher/delete_libraries_close.cypher"))
                    .param("libs", l.clone())
                    .param("now", now())],
            )
            .await?;
        for (what, file) in [
            (
                "delete library chunks",
                include_str!("../../../cypher/delete_libraries_chunks.cypher"),
            ),
            (
                "delete library items",
                include_str!("../../../cypher/delete_libraries_items.cypher"),
            ),
        ] {
            // Batches follow what the graph manages within the store timeout
            // (an ArcadeDB took ~10 s over 5,000 chunks of a 100,000-chunk
            // library, twice the default timeout).
            let mut batch = DeleteBatch::new(self.0.timeout);
            loop {
                let done = Arc::new(AtomicI64::new(0));
                let n = done.clone();
                let started = std::time::Instant::now();
                let out = self
                    .0
                    .transaction::<()>(
                        what,
                        false,
                        vec![Step::check(
                            query(file).param("libs", l.clone()).param("batch", batch.size),
                            move |rows| {
                                n.store(
                                    rows.first().map(|r| r.get("n")).transpose()?.unwrap_or(0),
                                    Ordering::Relaxed,
                                );
                                Ok(None)
                            },
                        )],
                    )
                    .await;
                match out {
                    Ok(_) => {}
                    // No answer in time (or the connection lost) while the
                    // graph itself still answers: the batch was too much for
                    // it. A smaller one goes again (a delete is idempotent).
                    // The abandoned one still runs on the graph and may
                    // commit: on ArcadeDB the two then conflict and one is
                    // retried; on Neo4j the smaller one waits for its locks,
                    // so it may run out of time too and shrink again. A
                    // graph that does not answer the ping either is an
                    // outage: the delete stops (after at most two store
                    // timeouts), the library stays closed, and a retry
                    // finishes it.
                    Err(GraphError::Unavailable(cause)) if batch.can_shrink() => {
                        if self.0.ping().await.is_err() {
                            return Err(GraphError::Unavailable(cause));
                        }
                        tracing::warn!(what, size = batch.size, %cause, "delete batch got no answer while the graph answers; smaller batches");
                        batch.shrink();
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                if done.load(Ordering::Relaxed) < batch.size {
                    break;
                }
                batch.took(started.elapsed());
            }
        }
        for lib in libs {
            self.forget_library(lib).await;
            // Indexes drop what is gone so far; again once all of it is.
            self.0.record_change(lib, None).await?;
        }
        let fences: Vec<String> = libs.iter().flat_map(|lib| fence_uids(lib)).collect();
        self.0
            .write_txn(
                "delete libraries",
                vec![
                    query(include_str!("../../../cypher/delete_libraries_fences.cypher")).param("fences", fences),
                    query(include_str!("../../../cypher/delete_libraries_remaining_chunks.cypher"))
                        .param("libs", l.clone()),
                    query(include_str!("../../../cypher/delete_libraries_remaining_items.cypher"))
                        .param("libs", l.clone()),
                    query(include_str!("../../../cypher/delete_libraries_collections.cypher")).param("libs", l.clone()),
                    query(include_str!("../../../cypher/delete_libraries.cypher")).param("libs", l),
                ],
            )
            .await?;
        for (lib, intent) in libs.iter().zip(intents) {
            self.0.record_intended(intent, lib, None).await?;
        }
        Ok(())
    }

    /// Records the changes of library deletes that began but may not have
    /// been recorded (their retry finds nothing left to delete): called by
    /// the library and workspace deletes with the libraries they clear.
    pub async fn settle_library_deletes(&self, libs: &[String]) -> Result<(), GraphError> {
        if libs.is_empty() {
            return Ok(());
        }
        self.0.record_pending(Pending::Libraries(libs)).await
    }

    /// `settle_library_deletes` for every library an earlier delete of
    /// `workspace` began on.
    pub async fn settle_workspace_delete(&self, workspace: &str) -> Result<(), GraphError> {
        self.0.record_pending(Pending::Workspace(workspace)).await
    }
}

/// How many chunks (or items) one transaction of a library delete takes. It
/// starts at `FIRST` and follows what the graph manages: each batch aims at a
/// quarter of the store timeout (the next at most twice or half the last),
/// and one that ran out of time goes again at a quarter of its size, down to
/// `MIN`.
#[derive(Debug)]
struct DeleteBatch {
    size: i64,
    aim: std::time::Duration,
}

impl DeleteBatch {
    const FIRST: i64 = 1_000;
    const MIN: i64 = 50;
    const MAX: i64 = 5_000;

    fn new(timeout: std::time::Duration) -> Self {
        DeleteBatch {
            size: Self::FIRST,
            aim: timeout / 4,
        }
    }

    /// The last full batch took `took`: the next is sized to take `aim`.
    fn took(&mut self, took: std::time::Duration) {
        let took = took.as_secs_f64().max(1e-3);
        let scaled = (self.size as f64 * self.aim.as_secs_f64() / took) as i64;
        self.size = scaled
            .clamp(self.size / 2, self.size.saturating_mul(2))
            .clamp(Self::MIN, Self::MAX);
    }

    fn can_shrink(&self) -> bool {
        self.size > Self::MIN
    }

    fn shrink(&mut self) {
        self.size = (self.size / 4).max(Self::MIN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_batches_stay_under_the_limit_and_keep_order() {
        let items: Vec<(usize, BoltType)> = (0..10).map(|i| (3_000, (i as i64).into())).collect();
        let batches = message_batches(items);
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 2, 2, 2]);
        let big = message_batches(vec![(20_000, 1i64.into()), (10, 2i64.into()), (10, 3i64.into())]);
        assert_eq!(big.iter().map(Vec::len).collect::<Vec<_>>(), vec![1, 2]);
        assert!(message_batches(Vec::new()).is_empty());
    }

    #[test]
    fn fences_are_spread_and_stable() {
        let lib = "lib_x";
        assert_eq!(fence_of(lib, "item-1"), fence_of(lib, "item-1"));
        let used: std::collections::HashSet<String> = (0..2_000).map(|i| fence_of(lib, &format!("i{i}"))).collect();
        assert!(used.len() > (FENCES as usize) * 3 / 4);
        assert!(used.iter().all(|f| fence_uids(lib).contains(f)));
    }

    #[test]
    fn delete_batches_follow_the_time_they_take() {
        let second = std::time::Duration::from_secs(1);
        let mut b = DeleteBatch::new(4 * second);
        assert_eq!(b.size, 1_000);
        // Fast batches grow, at most doubling, up to MAX.
        b.took(std::time::Duration::from_millis(10));
        assert_eq!(b.size, 2_000);
        for _ in 0..5 {
            b.took(std::time::Duration::from_millis(10));
        }
        assert_eq!(b.size, DeleteBatch::MAX);
        // One that took its aim stays; a slower one shrinks, at most halving.
        b.took(second);
        assert_eq!(b.size, DeleteBatch::MAX);
        b.took(2 * second);
        assert_eq!(b.size, 2_500);
        b.took(100 * second);
        assert_eq!(b.size, 1_250);
        b.took(std::time::Duration::from_millis(1_250));
        assert_eq!(b.size, 1_000);
        // A timed-out batch goes again at a quarter, down to MIN, and then no more.
        let mut shrunk = Vec::new();
        while b.can_shrink() {
            b.shrink();
            shrunk.push(b.size);
        }
        assert_eq!(shrunk, vec![250, 62, 50]);
        b.took(100 * second);
        assert_eq!(b.size, DeleteBatch::MIN);
        // A zero duration (a coarse clock) is not a division by zero.
        b.took(std::time::Duration::ZERO);
        assert_eq!(b.size, 100);
    }
}
