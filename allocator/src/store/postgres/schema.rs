//! The PostgreSQL store's schema: its tables created or upgraded in place, the hosts seeded, and
//! the PL/pgSQL functions that write a batch in one call.

use super::*;

/// Creates the schema, or checks its version, and seeds the inventory's hosts, in one transaction.
pub(super) fn init(client: &mut Client, name: &str, inventory: &InventorySpec) -> Result<(), StoreError> {
    let sql = |context: &'static str| {
        move |source: postgres::Error| StoreError::Sql { store: name.to_owned(), context, source: source.into() }
    };
    let mut tx = client.transaction().map_err(sql("starting the schema set-up"))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)")
        .map_err(sql("creating the schema"))?;
    let found: Option<i64> = tx
        .query_opt("SELECT value FROM meta WHERE key = 'schema_version'", &[])
        .map_err(sql("reading the schema version"))?
        .map(|row| row.get(0));
    match found {
        Some(version) if version > SCHEMA_VERSION => {
            return Err(StoreError::SchemaVersion {
                store: name.to_owned(),
                found: version,
                ours: SCHEMA_VERSION,
                fix: NEWER_SCHEMA_FIX,
            })
        }
        Some(SCHEMA_VERSION) => {}
        _ => {
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS hosts (
                     host_id TEXT PRIMARY KEY,
                     cores_cap BIGINT NOT NULL, memory_cap BIGINT NOT NULL, ssd_cap BIGINT NOT NULL,
                     cores_used BIGINT NOT NULL DEFAULT 0, memory_used BIGINT NOT NULL DEFAULT 0,
                     ssd_used BIGINT NOT NULL DEFAULT 0,
                     state TEXT,
                     policy TEXT,
                     policy_state TEXT,
                     CONSTRAINT hosts_never_over_committed CHECK (
                         cores_used BETWEEN 0 AND cores_cap AND memory_used BETWEEN 0 AND memory_cap
                         AND ssd_used BETWEEN 0 AND ssd_cap)
                 );
                 CREATE SEQUENCE IF NOT EXISTS vm_seq;
                 CREATE TABLE IF NOT EXISTS vms (
                     vm_id TEXT PRIMARY KEY,
                     seq BIGINT NOT NULL UNIQUE,
                     host_id TEXT NOT NULL,
                     tenant_id TEXT NOT NULL,
                     vm_type TEXT NOT NULL,
                     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL,
                     placed_at_s DOUBLE PRECISION NOT NULL,
                     prediction TEXT,
                     requested_at_s DOUBLE PRECISION,
                     request TEXT
                 );
                 ALTER TABLE vms DROP CONSTRAINT IF EXISTS vms_host_id_fkey;
                 ALTER TABLE vms ADD COLUMN IF NOT EXISTS requested_at_s DOUBLE PRECISION;
                 ALTER TABLE vms ADD COLUMN IF NOT EXISTS request TEXT;
                 CREATE TABLE IF NOT EXISTS migrations (
                     vm_id TEXT PRIMARY KEY,
                     target_host_id TEXT NOT NULL REFERENCES hosts (host_id),
                     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS drain (id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
                 CREATE TABLE IF NOT EXISTS consolidation (
                     id INTEGER PRIMARY KEY CHECK (id = 1), record TEXT NOT NULL);
                 ALTER TABLE hosts ADD COLUMN IF NOT EXISTS last_seq BIGINT NOT NULL DEFAULT 0;
                 CREATE TABLE IF NOT EXISTS changes (seq BIGINT PRIMARY KEY, agent TEXT NOT NULL, body TEXT NOT NULL);
                 -- Positions from a sequence since schema 8, where version 7 kept a head row.
                 CREATE TABLE IF NOT EXISTS log_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL);
                 INSERT INTO log_head (id, seq) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
                 CREATE SEQUENCE IF NOT EXISTS log_seq;
                 -- (Schema 8 has the sequence already: it never goes back.)
                 SELECT setval('log_seq', GREATEST(seq, (SELECT COALESCE(max(seq), 0) FROM changes),
                                                   COALESCE(pg_sequence_last_value('log_seq'), 0), 1),
                               GREATEST(seq, (SELECT COALESCE(max(seq), 0) FROM changes),
                                        COALESCE(pg_sequence_last_value('log_seq'), 0)) > 0)
                     FROM log_head WHERE id = 1;
                 DROP TABLE log_head;
                 CREATE TABLE IF NOT EXISTS rejections (
                     vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now());
                 CREATE INDEX IF NOT EXISTS rejections_by_seq ON rejections (seq);
                 CREATE TABLE IF NOT EXISTS releases (vm_id TEXT PRIMARY KEY, seq BIGINT NOT NULL);
                 CREATE INDEX IF NOT EXISTS releases_by_seq ON releases (seq);
                 CREATE TABLE IF NOT EXISTS exits (
                     start_s DOUBLE PRECISION NOT NULL,
                     seq BIGINT NOT NULL,
                     vm_id TEXT NOT NULL,
                     host_id TEXT NOT NULL,
                     tenant_id TEXT NOT NULL,
                     vm_type TEXT NOT NULL,
                     cores_base BIGINT NOT NULL, memory_base BIGINT NOT NULL, ssd_base BIGINT NOT NULL,
                     placed_at_s DOUBLE PRECISION NOT NULL,
                     prediction TEXT,
                     requested_at_s DOUBLE PRECISION,
                     request TEXT,
                     ended_at_s DOUBLE PRECISION NOT NULL,
                     PRIMARY KEY (start_s, seq)
                 );
                 CREATE SEQUENCE IF NOT EXISTS inventory_seq;
                 CREATE TABLE IF NOT EXISTS inventory (host_id TEXT PRIMARY KEY, pos BIGINT NOT NULL, entry TEXT);
                 INSERT INTO meta (key, value) VALUES ('schema_version', 10)
                     ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;",
            )
            .map_err(sql("creating the schema"))?;
            tx.batch_execute(BATCH_FUNCTIONS).map_err(sql("creating the batch functions"))?;
        }
    }
    seed_hosts(&mut tx, inventory, name)?;
    tx.commit().map_err(sql("committing the schema set-up"))
}

/// The server-side functions that write a batch (schema 5; schema 6 records releases), created or
/// replaced with the schema.
///
/// `allocator_log_batch` is the end of every batch: it moves the log's head (taking its row lock,
/// held to the commit: the log's order is the commit order), inserts the batch's row, records its
/// rejections and releases at that position, refuses the batch (an error rolls all of it back)
/// when another agent rejected one of the VM ids it places after this agent's view or less than
/// `p_stands` seconds ago (`AL002`, the ids as a JSON array in the detail), placed one of those it
/// rejects (`AL001`), or released one it places after this agent's view (`AL003`; also a view
/// older than the log keeps), and trims the log and the releases every 1,000 batches (the agent
/// notifies [`super::listener::CHANNEL`] after the commit: [`Notifier`]). Its
/// reads come after the head's lock is granted, each with a snapshot of its own (read
/// committed), so they see every batch committed before this one.
///
/// `allocator_commit_batch` writes a batch of placements, releases, host and policy states, then
/// calls the log's part: the placed VMs go in (the primary key refuses a second placement), the
/// released ones move to `exits`, each touched host's row is locked in the order of host ids (the
/// same for every agent: batches never deadlock on hosts; a host not in the store is refused
/// there, which is why `vms` needs no foreign key, whose per-row trigger cost 6% of the backend's
/// CPU) and gets its net use (the check refuses an over-commit), then the host and policy states.
/// Called outside a transaction, it is one.
///
/// Both read and write by key only, and say so to the planner (`SET enable_seqscan = off`): the
/// tables churn faster than autovacuum's statistics follow, and with them the planner scanned
/// the whole of `vms` (about 1,300 rows and 17,000 dead ones) for the released VMs of every batch
/// and `hosts` twice, in the agents bench (`pg_stat_user_tables`: one sequential scan of `vms`
/// per batch, no index scan), which was most of PostgreSQL's CPU per batch. Their statements
/// are planned once per connection (`plan_cache_mode = force_generic_plan`): with arrays for
/// parameters the plan cache otherwise planned each call afresh (13% of the backend's CPU).
pub(super) const BATCH_FUNCTIONS: &str = "
DROP FUNCTION IF EXISTS allocator_log_batch(text, text, bigint, double precision, bigint, text[], text[]);
DROP FUNCTION IF EXISTS allocator_log_batch(text, text, bigint, double precision, bigint, text[], text[], text[]);
DROP FUNCTION IF EXISTS allocator_commit_batch(
    text, text, bigint, double precision, bigint, text[], text[], text[], text[], bigint[], bigint[], bigint[],
    double precision[], text[], double precision[], text[], text[], double precision[], text[], text[], text[],
    text[], text[], text[]);

CREATE OR REPLACE FUNCTION allocator_position(
    p_agent text, p_body text, p_followed bigint, p_held bigint[], p_stands double precision, p_log_kept bigint,
    p_placed text[], p_rejected text[], p_released text[]) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_key integer;
    v_ids text[];
    v_seq bigint;
BEGIN
    -- The VM ids' locks, in one order for every batch: another batch deciding one of them commits
    -- wholly before or after this one, so the reads below see it or it sees this one.
    FOR v_key IN SELECT DISTINCT hashtext(id) FROM unnest(p_placed || p_rejected || p_released) AS id ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(4403, v_key);
    END LOOP;
    IF cardinality(p_placed) > 0 THEN
        SELECT array_agg(vm_id) INTO v_ids FROM rejections
            WHERE vm_id = ANY (p_placed)
              AND (seq > p_followed AND NOT seq = ANY (p_held) OR at > now() - p_stands * INTERVAL '1 second');
        IF v_ids IS NOT NULL THEN
            RAISE EXCEPTION 'VMs this batch places were rejected by another agent meanwhile'
                USING ERRCODE = 'AL002', DETAIL = array_to_json(v_ids)::text;
        END IF;
        -- A function, not `SELECT last_value FROM log_seq`: a scan with sequential scans off costs
        -- as much as JIT-compiling the query (130 ms a call), which it then does.
        IF p_followed < COALESCE(pg_sequence_last_value('log_seq'), 0) - p_log_kept THEN
            RAISE EXCEPTION 'this batch was decided on a view older than the change log keeps'
                USING ERRCODE = 'AL003', DETAIL = '[]';
        END IF;
        SELECT array_agg(vm_id) INTO v_ids FROM releases
            WHERE vm_id = ANY (p_placed) AND seq > p_followed AND NOT seq = ANY (p_held);
        IF v_ids IS NOT NULL THEN
            RAISE EXCEPTION 'VMs this batch places were released by another agent after its view'
                USING ERRCODE = 'AL003', DETAIL = array_to_json(v_ids)::text;
        END IF;
    END IF;
    IF cardinality(p_rejected) > 0 THEN
        SELECT array_agg(vm_id) INTO v_ids FROM vms WHERE vm_id = ANY (p_rejected);
        IF v_ids IS NOT NULL THEN
            RAISE EXCEPTION 'VMs this batch rejects were placed by another agent meanwhile'
                USING ERRCODE = 'AL001', DETAIL = array_to_json(v_ids)::text;
        END IF;
    END IF;
    -- Nothing refuses the batch from here on, and its row follows its position at once: a
    -- position stays unseen only while its batch commits, or when it was rolled back (a lost
    -- connection, a crash), which a follower then claims.
    v_seq := nextval('log_seq');
    INSERT INTO changes (seq, agent, body) VALUES (v_seq, p_agent, p_body);
    -- No NOTIFY here (schema 9): it would hold PostgreSQL's lock for notifications through the
    -- commit's flush, and every agent's commit would wait for the one before (the agent notifies
    -- after the commit instead).
    RETURN v_seq;
END
$fn$;

CREATE OR REPLACE FUNCTION allocator_log_at(
    p_seq bigint, p_agent text, p_stands double precision, p_log_kept bigint, p_rejected text[],
    p_released text[]) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $fn$
BEGIN
    IF cardinality(p_rejected) > 0 THEN
        INSERT INTO rejections (vm_id, seq, at)
            SELECT r.vm_id, p_seq, now() FROM unnest(p_rejected) AS r(vm_id)
            ON CONFLICT (vm_id) DO UPDATE SET seq = EXCLUDED.seq, at = EXCLUDED.at;
    END IF;
    IF cardinality(p_released) > 0 THEN
        INSERT INTO releases (vm_id, seq)
            SELECT r.vm_id, p_seq FROM unnest(p_released) AS r(vm_id)
            ON CONFLICT (vm_id) DO UPDATE SET seq = EXCLUDED.seq;
    END IF;
    IF p_seq % 1000 = 0 THEN
        DELETE FROM changes WHERE seq <= p_seq - p_log_kept;
        DELETE FROM rejections WHERE seq <= p_seq - p_log_kept AND at < now() - p_stands * INTERVAL '1 second';
        DELETE FROM releases WHERE seq <= p_seq - p_log_kept;
        INSERT INTO meta (key, value) VALUES ('log_pruned', p_seq - p_log_kept)
            ON CONFLICT (key) DO UPDATE SET value = GREATEST(meta.value, EXCLUDED.value);
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION allocator_log_batch(
    p_agent text, p_body text, p_followed bigint, p_held bigint[], p_stands double precision, p_log_kept bigint,
    p_placed text[], p_rejected text[], p_released text[], p_hosts text[]) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_seq bigint;
BEGIN
    v_seq := allocator_position(p_agent, p_body, p_followed, p_held, p_stands, p_log_kept, p_placed, p_rejected,
                                p_released);
    IF cardinality(p_hosts) > 0 THEN
        UPDATE hosts SET last_seq = v_seq WHERE host_id = ANY (p_hosts);
    END IF;
    PERFORM allocator_log_at(v_seq, p_agent, p_stands, p_log_kept, p_rejected, p_released);
    RETURN v_seq;
END
$fn$;

CREATE OR REPLACE FUNCTION allocator_commit_batch(
    p_agent text, p_body text, p_followed bigint, p_held bigint[], p_stands double precision, p_log_kept bigint,
    p_vm_id text[], p_host_id text[], p_tenant_id text[], p_vm_type text[],
    p_cores bigint[], p_memory bigint[], p_ssd bigint[], p_placed_at_s double precision[],
    p_prediction text[], p_requested_at_s double precision[], p_request text[],
    p_released text[], p_ended_at_s double precision[],
    p_state_host text[], p_state text[],
    p_policy_host text[], p_policy text[], p_policy_state text[],
    p_rejected text[]) RETURNS bigint[]
LANGUAGE plpgsql SET enable_seqscan = off SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_hosts text[];
    v_cores bigint[];
    v_memory bigint[];
    v_ssd bigint[];
    v_touched text[];
    v_locked bigint;
    v_missing text;
    v_earlier bigint[];
    v_seq bigint;
BEGIN
    IF cardinality(p_vm_id) > 0 THEN
        INSERT INTO vms (vm_id, seq, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base,
                         placed_at_s, prediction, requested_at_s, request)
            SELECT v.vm_id, nextval('vm_seq'), v.host_id, v.tenant_id, v.vm_type, v.cores, v.memory, v.ssd,
                   v.placed_at_s, v.prediction, v.requested_at_s, v.request
            FROM unnest(p_vm_id, p_host_id, p_tenant_id, p_vm_type, p_cores, p_memory, p_ssd, p_placed_at_s,
                        p_prediction, p_requested_at_s, p_request)
                 WITH ORDINALITY
                 AS v(vm_id, host_id, tenant_id, vm_type, cores, memory, ssd, placed_at_s, prediction,
                      requested_at_s, request, position)
            ORDER BY v.position;
    END IF;
    -- The released VMs leave for exits, and each host's net use of the batch, in host order.
    WITH gone AS (DELETE FROM vms WHERE vm_id = ANY (p_released) RETURNING *),
         kept AS (INSERT INTO exits (start_s, seq, vm_id, host_id, tenant_id, vm_type, cores_base,
                                     memory_base, ssd_base, placed_at_s, prediction, requested_at_s,
                                     request, ended_at_s)
                  SELECT COALESCE(g.requested_at_s, g.placed_at_s), g.seq, g.vm_id, g.host_id,
                         g.tenant_id, g.vm_type, g.cores_base, g.memory_base, g.ssd_base,
                         g.placed_at_s, g.prediction, g.requested_at_s, g.request, e.ended_at_s
                  FROM gone g JOIN unnest(p_released, p_ended_at_s) AS e(vm_id, ended_at_s) ON e.vm_id = g.vm_id),
         moved AS (SELECT p.host_id, p.cores, p.memory, p.ssd
                   FROM unnest(p_host_id, p_cores, p_memory, p_ssd) AS p(host_id, cores, memory, ssd)
                   UNION ALL
                   SELECT g.host_id, -g.cores_base, -g.memory_base, -g.ssd_base FROM gone g),
         net AS (SELECT host_id, sum(cores)::bigint AS cores, sum(memory)::bigint AS memory,
                        sum(ssd)::bigint AS ssd
                 FROM moved GROUP BY host_id)
    SELECT array_agg(host_id ORDER BY host_id),
           array_agg(host_id ORDER BY host_id) FILTER (WHERE cores <> 0 OR memory <> 0 OR ssd <> 0),
           array_agg(cores ORDER BY host_id) FILTER (WHERE cores <> 0 OR memory <> 0 OR ssd <> 0),
           array_agg(memory ORDER BY host_id) FILTER (WHERE cores <> 0 OR memory <> 0 OR ssd <> 0),
           array_agg(ssd ORDER BY host_id) FILTER (WHERE cores <> 0 OR memory <> 0 OR ssd <> 0)
        INTO v_touched, v_hosts, v_cores, v_memory, v_ssd
        FROM net;
    -- Every host a VM goes to or leaves, sorted and distinct already: the common batch needs no
    -- statement for it.
    IF cardinality(p_state_host) > 0 OR cardinality(p_policy_host) > 0 THEN
        SELECT array_agg(DISTINCT h) INTO v_touched
            FROM unnest(COALESCE(v_touched, '{}') || p_state_host || p_policy_host) AS h;
    END IF;
    IF v_touched IS NOT NULL THEN
        -- Locked, the hosts' last positions are those of the last batches committed on them.
        SELECT count(*), array_agg(DISTINCT l.last_seq) FILTER (WHERE l.last_seq > p_followed)
            INTO v_locked, v_earlier
            FROM (SELECT host_id, last_seq FROM hosts WHERE host_id = ANY (v_touched)
                  ORDER BY host_id FOR NO KEY UPDATE) AS l;
        IF v_locked < cardinality(v_touched) THEN
            SELECT h INTO v_missing FROM unnest(v_touched) AS h
                WHERE NOT EXISTS (SELECT 1 FROM hosts WHERE host_id = h) ORDER BY h LIMIT 1;
            RAISE EXCEPTION 'host `%` is not in the store', v_missing USING ERRCODE = 'foreign_key_violation';
        END IF;
    END IF;
    IF v_hosts IS NOT NULL THEN
        UPDATE hosts SET cores_used = hosts.cores_used + d.cores, memory_used = hosts.memory_used + d.memory,
                         ssd_used = hosts.ssd_used + d.ssd
            FROM unnest(v_hosts, v_cores, v_memory, v_ssd) AS d(host_id, cores, memory, ssd)
            WHERE hosts.host_id = d.host_id;
    END IF;
    IF cardinality(p_policy_host) > 0 THEN
        UPDATE hosts SET policy = d.policy, policy_state = d.state
            FROM unnest(p_policy_host, p_policy, p_policy_state) AS d(host_id, policy, state)
            WHERE hosts.host_id = d.host_id;
    END IF;
    IF cardinality(p_state_host) > 0 THEN
        UPDATE hosts SET state = d.state
            FROM unnest(p_state_host, p_state) AS d(host_id, state)
            WHERE hosts.host_id = d.host_id;
    END IF;
    -- The position after every lock (the hosts' here, the VM ids' in `allocator_position`):
    -- batches that touch one row get positions in the order they commit.
    v_seq := allocator_position(p_agent, p_body, p_followed, p_held, p_stands, p_log_kept, p_vm_id, p_rejected,
                                p_released);
    IF v_touched IS NOT NULL THEN
        UPDATE hosts SET last_seq = v_seq WHERE host_id = ANY (v_touched);
    END IF;
    PERFORM allocator_log_at(v_seq, p_agent, p_stands, p_log_kept, p_rejected, p_released);
    RETURN ARRAY[v_seq] || COALESCE(v_earlier, '{}');
END
$fn$;
";

/// Adds the inventory's hosts that the store lacks, and brings every host's capacity to the
/// inventory's, but for the hosts changed while the allocator ran (`inventory`). A capacity below
/// what a host's VMs use is refused, naming the host.
fn seed_hosts(tx: &mut Transaction<'_>, inventory: &InventorySpec, name: &str) -> Result<(), StoreError> {
    // Only the hosts that are missing or differ are written: an agent that starts (or reloads)
    // while others commit then takes no lock on their hosts' rows.
    let stored: std::collections::HashMap<String, [i64; RESOURCE_DIMS]> = tx
        .query("SELECT host_id, cores_cap, memory_cap, ssd_cap FROM hosts", &[])
        .map_err(|source| StoreError::Sql {
            store: name.to_owned(),
            context: "reading the hosts",
            source: source.into(),
        })?
        .into_iter()
        .map(|row| (row.get(0), [row.get(1), row.get(2), row.get(3)]))
        .collect();
    // A host added, changed or removed while the allocator ran is as that left it.
    let changed: std::collections::HashSet<String> = tx
        .query("SELECT host_id FROM inventory", &[])
        .map_err(|source| StoreError::Sql {
            store: name.to_owned(),
            context: "reading the inventory",
            source: source.into(),
        })?
        .into_iter()
        .map(|row| row.get(0))
        .collect();
    let hosts: Vec<_> = inventory
        .hosts()
        .filter(|host| !changed.contains(host.host.as_str()))
        .filter(|host| stored.get(host.host.as_str()) != Some(&units(&host.capacity)))
        .collect();
    for chunk in hosts.chunks(SEED_CHUNK) {
        let mut statement = String::from("INSERT INTO hosts (host_id, cores_cap, memory_cap, ssd_cap) VALUES ");
        let mut values: Vec<Box<dyn postgres::types::ToSql + Sync>> = Vec::with_capacity(chunk.len() * 4);
        for (i, host) in chunk.iter().enumerate() {
            if i > 0 {
                statement.push(',');
            }
            statement.push_str(&format!("(${}, ${}, ${}, ${})", 4 * i + 1, 4 * i + 2, 4 * i + 3, 4 * i + 4));
            let [cores, memory, ssd] = units(&host.capacity);
            values.push(Box::new(host.host.as_str().to_owned()));
            values.extend([Box::new(cores) as Box<dyn postgres::types::ToSql + Sync>, Box::new(memory), Box::new(ssd)]);
        }
        statement.push_str(
            " ON CONFLICT (host_id) DO UPDATE SET cores_cap = EXCLUDED.cores_cap, memory_cap = EXCLUDED.memory_cap,
                                                ssd_cap = EXCLUDED.ssd_cap",
        );
        let params: Vec<&(dyn postgres::types::ToSql + Sync)> = values.iter().map(|v| v.as_ref()).collect();
        if let Err(source) = tx.execute(statement.as_str(), &params) {
            if source.code() == Some(&SqlState::CHECK_VIOLATION) {
                return Err(StoreError::Refused {
                    store: name.to_owned(),
                    detail: "the inventory gives a host less capacity than its VMs in the store use; give it its \
                             capacity back, or release those VMs first"
                        .to_owned(),
                });
            }
            return Err(StoreError::Sql {
                store: name.to_owned(),
                context: "seeding the hosts",
                source: source.into(),
            });
        }
    }
    Ok(())
}
