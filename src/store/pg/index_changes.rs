//! The search index's per-library change sequence (migration
//! `20261129000001_search_index.sql`): what every replica's index catches up
//! from. Written after a graph write committed and before it is
//! acknowledged; read once per search (the freshness check) and, when a
//! library moved, in pages (the catch-up).

use sqlx::PgPool;

/// One recorded change: the item that changed, or None when the whole
/// library did (deleted: rebuild it from the graph).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub seq: i64,
    pub item_uid: Option<String>,
}

/// One change of `$1` (library) for `$2` (item or NULL): the counter bumped
/// under its row lock and the change row, in one statement (after `WITH`).
macro_rules! bump_sql {
    () => {
        "s AS (
             INSERT INTO index_sequences (library_uid, seq) VALUES ($1, 1)
             ON CONFLICT (library_uid) DO UPDATE SET seq = index_sequences.seq + 1
             RETURNING seq)
         INSERT INTO index_changes (library_uid, seq, item_uid)
         SELECT $1, s.seq, $2 FROM s
         RETURNING seq"
    };
}

/// This database's identity (what an index's sequence numbers refer to).
pub async fn epoch(pool: &PgPool) -> Result<String, sqlx::Error> {
    sqlx::query_scalar("SELECT id::text FROM index_epoch")
        .fetch_one(pool)
        .await
}

/// Records that `item_uid` (None: the whole library) of `library_uid`
/// changed; returns the library's new sequence number. One statement, so
/// the counter and its change row commit together; the counter's row lock
/// makes a library's sequence numbers commit in order.
pub async fn record<'e>(
    pool: impl sqlx::PgExecutor<'e>,
    library_uid: &str,
    item_uid: Option<&str>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(concat!("WITH ", bump_sql!()))
        .bind(library_uid)
        .bind(item_uid)
        .fetch_one(pool)
        .await
}

/// Records, before a write touches the graph, the change it is about to
/// make (`item_uid` of `library_uid`; None: the whole library); returns the
/// intent's id. Kept until `record_intended` records the change (or the
/// sweep does, when that failed): see migration `..._index_intents.sql`.
pub async fn intend(
    pool: &PgPool,
    library_uid: &str,
    item_uid: Option<&str>,
    workspace_id: Option<&str>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO index_intents (library_uid, item_uid, workspace_id) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(library_uid)
    .bind(item_uid)
    .bind(workspace_id)
    .fetch_one(pool)
    .await
}

/// `record`, and the removal of the write's intent, in one statement (both
/// or neither); returns the library's new sequence number. An intent a
/// sweep holds is left to it (`SKIP LOCKED`): the statement holds the
/// library's sequence row by then, and the sweep, having taken the intent,
/// waits for that row to record the same change — waiting for the intent
/// was a deadlock, and Postgres aborted the write (a 503 for a committed
/// write). The intent left is recorded once more and expires, harmlessly.
pub async fn record_intended(
    pool: &PgPool,
    intent: i64,
    library_uid: &str,
    item_uid: Option<&str>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(concat!(
        "WITH done AS (DELETE FROM index_intents
                        WHERE id IN (SELECT id FROM index_intents WHERE id = $3 FOR UPDATE SKIP LOCKED)), ",
        bump_sql!()
    ))
    .bind(library_uid)
    .bind(item_uid)
    .bind(intent)
    .fetch_one(pool)
    .await
}

/// Removes the intent of a write that changed nothing.
pub async fn forget_intent(pool: &PgPool, intent: i64) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM index_intents WHERE id = $1")
        .bind(intent)
        .execute(pool)
        .await
        .map(|_| ())
}

/// Which intents `record_pending` records.
pub enum Pending<'a> {
    /// Those of an item, in whatever library (a delete's retry that found nothing).
    Item(&'a str),
    /// Those of whole libraries (a library or workspace delete's retry).
    Libraries(&'a [String]),
    /// Those of a workspace's delete (its retry, which finds no library).
    Workspace(&'a str),
}

/// Records the change of every intent `which` selects (once per library and
/// item), leaving the intents in place: a write still running keeps its own
/// (`record_intended` removes it), the sweep removes the rest once expired.
/// Returns how many changes were recorded.
pub async fn record_pending(pool: &PgPool, which: Pending<'_>) -> Result<usize, sqlx::Error> {
    let q = match which {
        Pending::Item(item) => {
            sqlx::query_as("SELECT DISTINCT library_uid, item_uid FROM index_intents WHERE item_uid = $1")
                .bind(item.to_owned())
        }
        Pending::Libraries(libs) => sqlx::query_as(
            "SELECT DISTINCT library_uid, item_uid FROM index_intents
              WHERE item_uid IS NULL AND library_uid = ANY($1)",
        )
        .bind(libs.to_vec()),
        Pending::Workspace(ws) => {
            sqlx::query_as("SELECT DISTINCT library_uid, item_uid FROM index_intents WHERE workspace_id = $1")
                .bind(ws.to_owned())
        }
    };
    let pending: Vec<(String, Option<String>)> = q.fetch_all(pool).await?;
    for (library, item) in &pending {
        record(pool, library, item.as_deref()).await?;
    }
    Ok(pending.len())
}

/// The sweep's part: records, in one transaction, the changes of intents
/// older than `grace` seconds that no sweep recorded yet, and once more of
/// those older than `late` seconds (a graph commit that landed late), at
/// most 1,000 at a time; each intent is taken by one replica (`SKIP
/// LOCKED`). Returns how many changes were recorded.
pub async fn sweep_intents(pool: &PgPool, grace: f64, late: f64) -> Result<usize, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let taken: Vec<(String, Option<String>)> = sqlx::query_as(
        "UPDATE index_intents SET swept = now()
          WHERE id IN (SELECT id FROM index_intents
                        WHERE at < now() - make_interval(secs => $1)
                          AND (swept IS NULL
                               OR (swept < at + make_interval(secs => $2)
                                   AND at < now() - make_interval(secs => $2)))
                        ORDER BY id LIMIT 1000
                        FOR UPDATE SKIP LOCKED)
          RETURNING library_uid, item_uid",
    )
    .bind(grace)
    .bind(late)
    .fetch_all(&mut *tx)
    .await?;
    let distinct: std::collections::BTreeSet<(String, Option<String>)> = taken.into_iter().collect();
    for (library, item) in &distinct {
        record(&mut *tx, library, item.as_deref()).await?;
    }
    tx.commit().await?;
    Ok(distinct.len())
}

/// Removes intents older than `secs` seconds (after the sweep recorded
/// them); returns how many went.
pub async fn expire_intents(pool: &PgPool, secs: f64) -> Result<u64, sqlx::Error> {
    sqlx::query("DELETE FROM index_intents WHERE at < now() - make_interval(secs => $1)")
        .bind(secs)
        .execute(pool)
        .await
        .map(|r| r.rows_affected())
}

/// Records that the `items` of `library_uid` changed (their vectors were
/// stored), one sequence number each, in one statement; returns the
/// library's new sequence number (None for no items).
pub async fn record_items(pool: &PgPool, library_uid: &str, items: &[String]) -> Result<Option<i64>, sqlx::Error> {
    if items.is_empty() {
        return Ok(None);
    }
    sqlx::query_scalar(
        "WITH s AS (
             INSERT INTO index_sequences (library_uid, seq) VALUES ($1, cardinality($2::text[]))
             ON CONFLICT (library_uid) DO UPDATE SET seq = index_sequences.seq + cardinality($2::text[])
             RETURNING seq)
         INSERT INTO index_changes (library_uid, seq, item_uid)
         SELECT $1, s.seq - cardinality($2::text[]) + i.ord, i.item
           FROM s, unnest($2::text[]) WITH ORDINALITY AS i(item, ord)
         RETURNING seq",
    )
    .bind(library_uid)
    .bind(items)
    .fetch_all(pool)
    .await
    .map(|seqs: Vec<i64>| seqs.into_iter().max())
}

/// The current sequence of each of `libraries` that ever changed (absent:
/// never written, sequence 0). One primary-key read.
pub async fn sequences<'e>(
    db: impl sqlx::PgExecutor<'e>,
    libraries: &[String],
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    if libraries.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as("SELECT library_uid, seq FROM index_sequences WHERE library_uid = ANY($1)")
        .bind(libraries)
        .fetch_all(db)
        .await
}

/// The changes of `library_uid` after `after`, in order, at most `limit`.
pub async fn page(pool: &PgPool, library_uid: &str, after: i64, limit: i64) -> Result<Vec<Change>, sqlx::Error> {
    let rows: Vec<(i64, Option<String>)> = sqlx::query_as(
        "SELECT seq, item_uid FROM index_changes
          WHERE library_uid = $1 AND seq > $2
          ORDER BY seq LIMIT $3",
    )
    .bind(library_uid)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(seq, item_uid)| Change { seq, item_uid })
        .collect())
}

/// Deletes change rows older than `days` (a replica whose index is older
/// than what is kept rebuilds that library: `page` then starts past its
/// sequence). Returns how many went.
pub async fn sweep(pool: &PgPool, days: u32) -> Result<u64, sqlx::Error> {
    sqlx::query("DELETE FROM index_changes WHERE at < now() - make_interval(days => $1)")
        .bind(days as i32)
        .execute(pool)
        .await
        .map(|r| r.rows_affected())
}

/// The index sequences a replica heard on `INDEX_CHANNEL` (or read while
/// its listener was trusted), so that a search need not read them: only
/// valid while that listener is trusted, and forgotten whenever it may have
/// missed an announcement (`forget_all`: a new LISTEN connection, a
/// heartbeat heard late). Bounded: past `KNOWN_MAX` libraries it starts again
/// from empty.
#[derive(Default)]
pub struct KnownSequences {
    inner: std::sync::Mutex<Known>,
}

#[derive(Default)]
struct Known {
    /// Bumped by every `forget_all`: a read that began before it is not kept.
    generation: u64,
    seqs: std::collections::HashMap<String, i64>,
}

/// Most libraries whose sequence a replica keeps.
pub const KNOWN_MAX: usize = 100_000;

impl KnownSequences {
    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An announcement heard: `seq` is `library`'s sequence as of a commit
    /// no earlier than any it announced before.
    pub fn heard(&self, library: &str, seq: i64) {
        let mut k = self.lock();
        if !k.seqs.contains_key(library) && k.seqs.len() >= KNOWN_MAX {
            k.generation += 1;
            k.seqs.clear();
        }
        let at = k.seqs.entry(library.to_owned()).or_insert(seq);
        *at = (*at).max(seq);
    }

    /// Applies one `INDEX_CHANNEL` payload (`<seq>:<library_uid>`); false
    /// when it is not one (then nothing heard can be trusted).
    pub fn apply(&self, payload: &str) -> bool {
        match payload.split_once(':').map(|(s, lib)| (s.parse::<i64>(), lib)) {
            Some((Ok(seq), lib)) => {
                self.heard(lib, seq);
                true
            }
            _ => false,
        }
    }

    /// Each of `libraries`' sequences (0: never written), when every one
    /// is known.
    pub fn get(&self, libraries: &[String]) -> Option<std::collections::HashMap<String, i64>> {
        let k = self.lock();
        libraries
            .iter()
            .map(|l| k.seqs.get(l).map(|s| (l.clone(), *s)))
            .collect()
    }

    /// Where `learn` is to check that nothing was forgotten since.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Keeps a read of `asked` (its `rows`; an absent library was never
    /// written) that began, at `generation`, while the listener was trusted:
    /// whatever committed after the read's snapshot is heard. Dropped when
    /// anything was forgotten since it began.
    pub fn learn(&self, generation: u64, asked: &[String], rows: &std::collections::HashMap<String, i64>) {
        let mut k = self.lock();
        if k.generation != generation {
            return;
        }
        if k.seqs.len() + asked.len() > KNOWN_MAX {
            k.generation += 1;
            k.seqs.clear();
            return;
        }
        for lib in asked {
            let seq = rows.get(lib).copied().unwrap_or(0);
            let at = k.seqs.entry(lib.clone()).or_insert(seq);
            *at = (*at).max(seq);
        }
    }

    /// Forgets everything (an announcement may have been missed).
    pub fn forget_all(&self) {
        let mut k = self.lock();
        k.generation += 1;
        k.seqs.clear();
    }

    /// How many libraries' sequences are known.
    pub fn len(&self) -> usize {
        self.lock().seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn libs(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn sequences_heard_only_grow_and_a_read_begun_before_a_forget_is_not_kept() {
        let k = KnownSequences::default();
        assert!(k.apply("7:lib:with:colons"));
        assert!(k.apply("5:lib:with:colons"), "an older announcement is still one");
        assert!(!k.apply("seven:lib"));
        assert!(!k.apply("no separator"));
        assert_eq!(
            k.get(&libs(&["lib:with:colons"])),
            Some(HashMap::from([("lib:with:colons".into(), 7)]))
        );
        // Not every library known: no answer (the search reads them all).
        assert_eq!(k.get(&libs(&["lib:with:colons", "b"])), None);

        // A read of b and c (c never written) kept; an announcement heard
        // meanwhile is not lowered by it.
        let g = k.generation();
        k.heard("b", 4);
        k.learn(g, &libs(&["b", "c"]), &HashMap::from([("b".into(), 3)]));
        assert_eq!(
            k.get(&libs(&["b", "c"])),
            Some(HashMap::from([("b".into(), 4), ("c".into(), 0)]))
        );

        // A read that began before the sequences were forgotten is dropped.
        let g = k.generation();
        k.forget_all();
        assert!(k.is_empty());
        k.learn(g, &libs(&["d"]), &HashMap::from([("d".into(), 9)]));
        assert_eq!(k.get(&libs(&["d"])), None);
        k.learn(k.generation(), &libs(&["d"]), &HashMap::from([("d".into(), 9)]));
        assert_eq!(k.get(&libs(&["d"])), Some(HashMap::from([("d".into(), 9)])));
    }

    #[test]
    fn known_sequences_start_again_from_empty_past_their_bound() {
        let k = KnownSequences::default();
        for i in 0..KNOWN_MAX {
            k.heard(&format!("l{i}"), 1);
        }
        assert_eq!(k.len(), KNOWN_MAX);
        let g = k.generation();
        k.heard("one more", 1);
        assert_eq!(k.len(), 1);
        assert!(k.generation() > g, "a read begun before is not kept");
        k.heard("one more", 2);
        assert_eq!(k.len(), 1, "a library already known takes no room");
    }
}
