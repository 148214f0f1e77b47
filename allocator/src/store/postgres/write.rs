//! Writing a batch to the PostgreSQL store: set-based through the batch functions when it can be,
//! change by change otherwise, with the change log's entry and the hosts' locks.

use super::*;

/// Takes the row locks of `hosts` in one order for every agent (the database's order of host ids),
/// so that two batches never wait on each other's hosts in a cycle; refuses a host not in the store.
/// (`allocator_commit_batch` does the same for the set-based batches.)
const LOCK_HOSTS: &str = "SELECT host_id FROM hosts WHERE host_id = ANY($1::text[]) ORDER BY host_id FOR NO KEY UPDATE";

fn lock_hosts(tx: &mut Transaction<'_>, hosts: &[&str], name: &str) -> Result<(), StoreError> {
    if hosts.is_empty() {
        return Ok(());
    }
    let rows = tx.query(LOCK_HOSTS, &[&hosts]).map_err(refusal_or_sql(name, "locking hosts"))?;
    if rows.len() < hosts.len() {
        let found: std::collections::HashSet<String> = rows.iter().map(|row| row.get(0)).collect();
        let missing = hosts.iter().find(|host| !found.contains(**host)).copied().unwrap_or_default();
        return Err(StoreError::Refused {
            store: name.to_owned(),
            detail: format!("host `{missing}` is not in the store"),
        });
    }
    Ok(())
}

/// The statements of every batch, prepared once per connection: a statement sent as text is parsed
/// and planned again each time, and the client prepares it first, in a round trip of its own.
pub(super) struct Statements {
    pub(super) commit_batch: Statement,
    pub(super) log_batch: Statement,
    pub(super) follow: Statement,
    pub(super) claim: Statement,
}

impl Statements {
    pub(super) fn prepare(client: &mut Client) -> Result<Self, postgres::Error> {
        Ok(Statements {
            commit_batch: client.prepare(
                "SELECT allocator_commit_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                                               $16, $17, $18, $19, $20, $21, $22, $23, $24, $25)",
            )?,
            log_batch: client.prepare("SELECT allocator_log_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")?,
            // One snapshot for the rows and its transaction-id bounds (a row with no batch when
            // there is none to follow).
            // By the primary key, in its order (the log grows: a scan of it per follow cost ten
            // times the database's CPU per batch); the pruned mark with every row.
            follow: client.prepare(
                "SELECT seq, agent, body, COALESCE((SELECT value FROM meta WHERE key = 'log_pruned'), 0)
                 FROM changes WHERE seq > $1 ORDER BY seq",
            )?,
            claim: client.prepare(
                "INSERT INTO changes (seq, agent, body) SELECT seq, '', '[]' FROM unnest($1::bigint[]) AS seq
                 ON CONFLICT (seq) DO NOTHING",
            )?,
        })
    }
}

/// Whether [`commit_sets`] can write `changes`: placements, releases, host and policy states, with
/// no VM both placed and released (their order would matter).
pub(super) fn set_based(changes: &[Change]) -> bool {
    let mut placed = std::collections::HashSet::new();
    for change in changes {
        match change {
            Change::Placed { vm, .. } => {
                placed.insert(vm.id.as_str());
            }
            Change::Released { .. } | Change::HostState { .. } | Change::PolicyHostState { .. } => {}
            _ => return false,
        }
    }
    !changes.iter().any(|change| matches!(change, Change::Released { vm, .. } if placed.contains(vm.as_str())))
}

/// What the log's part of a batch needs besides its changes (`allocator_log_batch`'s arguments).
pub(super) struct LogEntry<'a> {
    pub(super) agent: &'a str,
    /// The batch's changes as the log keeps them (JSON).
    pub(super) body: String,
    /// The log positions this agent's view reflects: all up to `followed`, and `held` above it.
    pub(super) followed: i64,
    pub(super) held: Vec<i64>,
    /// The VM ids the batch places, and those it answered "rejected" (sorted, distinct).
    pub(super) placed: Vec<&'a str>,
    pub(super) rejected: Vec<&'a str>,
    /// The VM ids the batch releases.
    pub(super) released: Vec<&'a str>,
}

/// Writes a batch of placements, releases, host and policy states with one call of
/// `allocator_commit_batch` ([`BATCH_FUNCTIONS`]) outside a transaction: one round trip, one
/// transaction. Answers the batch's log position.
pub(super) fn commit_sets(
    client: &mut Client,
    statements: &Statements,
    changes: &[Change],
    log: &LogEntry<'_>,
    policy_state: &dyn Fn(&HostId) -> Option<String>,
    name: &str,
) -> Result<(i64, Vec<i64>), StoreError> {
    let mut vms = VmArrays::default();
    let (mut released, mut ends) = (Vec::new(), Vec::new());
    // One state per host, the batch's last (the function writes them as a set); the policy
    // states' snapshots are taken now, so the last one wins anyway.
    let mut states: BTreeMap<&str, &'static str> = BTreeMap::new();
    let mut policies: BTreeMap<&str, (&'static str, Option<String>)> = BTreeMap::new();
    for change in changes {
        match change {
            Change::Placed { vm, host } => {
                let [cores, memory, ssd] = units(&vm.facts.demand);
                vms.vm_id.push(vm.id.as_str());
                vms.host_id.push(host.as_str());
                vms.tenant_id.push(vm.facts.tenant_id.as_str());
                vms.vm_type.push(vm.facts.vm_type.as_str());
                vms.base[0].push(cores);
                vms.base[1].push(memory);
                vms.base[2].push(ssd);
                vms.placed_at_s.push(vm.placed_at_s);
                vms.prediction.push(prediction_json(vm, name)?);
                vms.requested_at_s.push(vm.facts.requested_at_s);
                vms.request.push(request_json(vm, name)?);
            }
            Change::Released { vm, ended_at_s, .. } => {
                released.push(vm.as_str());
                ends.push(*ended_at_s);
            }
            Change::HostState { host, state, .. } => {
                states.insert(host.as_str(), state_name(*state));
            }
            Change::PolicyHostState { host, policy } => {
                policies.insert(host.as_str(), (*policy, policy_state(host)));
            }
            // `set_based` sends the other changes to `write_each`.
            _ => {}
        }
    }
    let (state_hosts, state_names): (Vec<&str>, Vec<&str>) = states.into_iter().unzip();
    let policy_hosts: Vec<&str> = policies.keys().copied().collect();
    let (kinds, snapshots): (Vec<Option<&str>>, Vec<Option<&str>>) =
        policies.values().map(|(policy, state)| (state.as_ref().map(|_| *policy), state.as_deref())).unzip();
    let row = client
        .query_one(
            &statements.commit_batch,
            &[
                &log.agent,
                &log.body,
                &log.followed,
                &log.held,
                &REJECTION_STANDS_S,
                &LOG_KEPT,
                &vms.vm_id,
                &vms.host_id,
                &vms.tenant_id,
                &vms.vm_type,
                &vms.base[0],
                &vms.base[1],
                &vms.base[2],
                &vms.placed_at_s,
                &vms.prediction,
                &vms.requested_at_s,
                &vms.request,
                &released,
                &ends,
                &state_hosts,
                &state_names,
                &policy_hosts,
                &kinds,
                &snapshots,
                &log.rejected,
            ],
        )
        .map_err(refusal_or_sql(name, "committing a batch"))?;
    let mut positions: Vec<i64> = row.get(0);
    if positions.is_empty() {
        return Err(StoreError::Sql {
            store: name.to_owned(),
            context: "committing a batch",
            source: "the batch function answered no log position".into(),
        });
    }
    let seq = positions.remove(0);
    Ok((seq, positions))
}

/// The log's part of a batch, `allocator_log_batch` ([`BATCH_FUNCTIONS`]), on `client` (in a
/// batch's transaction, or a transaction of its own for a batch with no write). Answers the
/// batch's log position.
pub(super) fn log_batch(
    client: &mut impl postgres::GenericClient,
    statements: &Statements,
    log: &LogEntry<'_>,
    hosts: &[&str],
    name: &str,
) -> Result<i64, StoreError> {
    let row = client
        .query_one(
            &statements.log_batch,
            &[
                &log.agent,
                &log.body,
                &log.followed,
                &log.held,
                &REJECTION_STANDS_S,
                &LOG_KEPT,
                &log.placed,
                &log.rejected,
                &log.released,
                &hosts,
            ],
        )
        .map_err(refusal_or_sql(name, "appending to the change log"))?;
    Ok(row.get(0))
}

/// The placed VMs of a batch, column by column, for [`commit_sets`].
#[derive(Default)]
struct VmArrays<'a> {
    vm_id: Vec<&'a str>,
    host_id: Vec<&'a str>,
    tenant_id: Vec<&'a str>,
    vm_type: Vec<&'a str>,
    base: [Vec<i64>; RESOURCE_DIMS],
    placed_at_s: Vec<f64>,
    prediction: Vec<Option<String>>,
    requested_at_s: Vec<Option<f64>>,
    request: Vec<Option<String>>,
}

/// Writes a one-row record table (`drain`, `consolidation`): the record's JSON, or no row.
fn write_record(tx: &mut Transaction<'_>, table: &'static str, record: Option<String>) -> Result<u64, postgres::Error> {
    match record {
        Some(record) => tx.execute(
            &format!(
                "INSERT INTO {table} (id, record) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record"
            ),
            &[&record],
        ),
        None => tx.execute(&format!("DELETE FROM {table}"), &[]),
    }
}

/// Writes a batch change by change, in order: batches with drains or migrations, or that place and
/// release the same VM. The set-based [`commit_sets`] covers the rest.
pub(super) fn write_each(
    tx: &mut Transaction<'_>,
    changes: &[Change],
    policy_state: &dyn Fn(&HostId) -> Option<String>,
    name: &str,
) -> Result<Vec<String>, StoreError> {
    let sql = |context: &'static str| refusal_or_sql(name, context);
    // What each host's use changes by, written once per host at the end, in host order: two
    // agents' batches then lock hosts in the same order and cannot deadlock, and the check
    // judges each host's net use.
    let mut used: BTreeMap<String, [i64; RESOURCE_DIMS]> = BTreeMap::new();
    // The hosts whose state the batch writes besides.
    let mut stated: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut use_on = |host: &str, delta: [i64; RESOURCE_DIMS]| {
        let entry = used.entry(host.to_owned()).or_insert([0; RESOURCE_DIMS]);
        for (sum, d) in entry.iter_mut().zip(delta) {
            *sum += d;
        }
    };
    for change in changes {
        match change {
            Change::Placed { vm, host } => {
                let prediction = prediction_json(vm, name)?;
                let request = request_json(vm, name)?;
                let [cores, memory, ssd] = units(&vm.facts.demand);
                tx.execute(
                    "INSERT INTO vms (vm_id, seq, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base,
                                          placed_at_s, prediction, requested_at_s, request)
                         VALUES ($1, nextval('vm_seq'), $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    &[
                        &vm.id.as_str(),
                        &host.as_str(),
                        &vm.facts.tenant_id.as_str(),
                        &vm.facts.vm_type,
                        &cores,
                        &memory,
                        &ssd,
                        &vm.placed_at_s,
                        &prediction,
                        &vm.facts.requested_at_s,
                        &request,
                    ],
                )
                .map_err(sql("recording a placement"))?;
                use_on(host.as_str(), [cores, memory, ssd]);
            }
            Change::Released { vm, ended_at_s, .. } => {
                let row = tx
                    .query_opt(
                        "WITH gone AS (DELETE FROM vms WHERE vm_id = $1 RETURNING *),
                              kept AS (INSERT INTO exits (start_s, seq, vm_id, host_id, tenant_id, vm_type, cores_base,
                                                          memory_base, ssd_base, placed_at_s, prediction,
                                                          requested_at_s, request, ended_at_s)
                                       SELECT COALESCE(requested_at_s, placed_at_s), seq, vm_id, host_id, tenant_id,
                                              vm_type, cores_base, memory_base, ssd_base, placed_at_s, prediction,
                                              requested_at_s, request, $2
                                       FROM gone)
                         SELECT host_id, cores_base, memory_base, ssd_base FROM gone",
                        &[&vm.as_str(), ended_at_s],
                    )
                    .map_err(sql("recording a release"))?;
                if let Some(row) = row {
                    let host: String = row.get(0);
                    use_on(&host, [-row.get::<_, i64>(1), -row.get::<_, i64>(2), -row.get::<_, i64>(3)]);
                }
            }
            Change::Resized { vm, host, was } => {
                let [cores, memory, ssd] = units(&vm.facts.demand);
                let [old_cores, old_memory, old_ssd] = units(&was.record.facts.demand);
                tx.execute(
                    "UPDATE vms SET vm_type = $2, cores_base = $3, memory_base = $4, ssd_base = $5 WHERE vm_id = $1",
                    &[&vm.id.as_str(), &vm.facts.vm_type, &cores, &memory, &ssd],
                )
                .map_err(sql("recording a resize"))?;
                use_on(host.as_str(), [cores - old_cores, memory - old_memory, ssd - old_ssd]);
            }
            Change::HostState { host, state, .. } => {
                tx.execute("UPDATE hosts SET state = $2 WHERE host_id = $1", &[&host.as_str(), &state_name(*state)])
                    .map_err(sql("recording a host state"))?;
                stated.insert(host.as_str().to_owned());
            }
            Change::MigrationStarted { vm, target } => {
                let row = tx
                    .query_one("SELECT cores_base, memory_base, ssd_base FROM vms WHERE vm_id = $1", &[&vm.as_str()])
                    .map_err(sql("recording a migration"))?;
                let demand = [row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2)];
                tx.execute(
                    "INSERT INTO migrations (vm_id, target_host_id, cores_base, memory_base, ssd_base)
                         VALUES ($1, $2, $3, $4, $5)",
                    &[&vm.as_str(), &target.as_str(), &demand[0], &demand[1], &demand[2]],
                )
                .map_err(sql("recording a migration"))?;
                use_on(target.as_str(), demand);
            }
            Change::MigrationCompleted { vm, target } => {
                // The target holds the reservation already: the source gives the demand back.
                let source: String = tx
                    .query_one("SELECT host_id FROM vms WHERE vm_id = $1", &[&vm.as_str()])
                    .map_err(sql("recording a migration"))?
                    .get(0);
                let row = tx
                    .query_one(
                        "DELETE FROM migrations WHERE vm_id = $1 RETURNING cores_base, memory_base, ssd_base",
                        &[&vm.as_str()],
                    )
                    .map_err(sql("recording a migration"))?;
                tx.execute("UPDATE vms SET host_id = $2 WHERE vm_id = $1", &[&vm.as_str(), &target.as_str()])
                    .map_err(sql("recording a migration"))?;
                use_on(&source, [-row.get::<_, i64>(0), -row.get::<_, i64>(1), -row.get::<_, i64>(2)]);
            }
            Change::MigrationCancelled { vm } => {
                let row = tx
                    .query_opt(
                        "DELETE FROM migrations WHERE vm_id = $1
                             RETURNING target_host_id, cores_base, memory_base, ssd_base",
                        &[&vm.as_str()],
                    )
                    .map_err(sql("recording a migration"))?;
                if let Some(row) = row {
                    let target: String = row.get(0);
                    use_on(&target, [-row.get::<_, i64>(1), -row.get::<_, i64>(2), -row.get::<_, i64>(3)]);
                }
            }
            Change::Drain(drain) => {
                let record = drain
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()
                    .map_err(|e| StoreError::CorruptDrain { store: name.to_owned(), detail: e.to_string() })?;
                write_record(tx, "drain", record).map_err(sql("recording the drain"))?;
            }
            Change::Consolidation(consolidation) => {
                let record =
                    consolidation.as_ref().map(serde_json::to_string).transpose().map_err(|e| {
                        StoreError::CorruptConsolidation { store: name.to_owned(), detail: e.to_string() }
                    })?;
                write_record(tx, "consolidation", record).map_err(sql("recording the consolidation"))?;
            }
            Change::PolicyHostState { host, policy } => {
                let state = policy_state(host);
                let policy = state.as_ref().map(|_| *policy);
                tx.execute(
                    "UPDATE hosts SET policy = $2, policy_state = $3 WHERE host_id = $1",
                    &[&host.as_str(), &policy, &state],
                )
                .map_err(sql("recording a policy host state"))?;
                stated.insert(host.as_str().to_owned());
            }
            Change::HostInventory { host, entry } => {
                if write_entry(tx, host.as_str(), entry.as_ref(), name)? {
                    stated.insert(host.as_str().to_owned());
                }
            }
        }
    }
    // Every host a VM went to or left, also with no net change: the lock refuses a host not in
    // the store (`vms` has no foreign key since schema 5).
    let hosts: Vec<&str> = used.keys().map(String::as_str).collect();
    lock_hosts(tx, &hosts, name)?;
    for (host, delta) in used.iter().filter(|(_, delta)| delta.iter().any(|d| *d != 0)) {
        add_use(tx, host, *delta, name)?;
    }
    // Every host row the batch wrote, to carry the batch's position.
    stated.extend(used.into_keys());
    Ok(stated.into_iter().collect())
}

/// Adds `delta` (base units, negative to give back) to what `host` uses; the table's check refuses
/// an over-commit.
fn add_use(tx: &mut Transaction<'_>, host: &str, delta: [i64; RESOURCE_DIMS], name: &str) -> Result<(), StoreError> {
    let updated = tx
        .execute(
            "UPDATE hosts SET cores_used = cores_used + $2, memory_used = memory_used + $3, ssd_used = ssd_used + $4
             WHERE host_id = $1",
            &[&host, &delta[0], &delta[1], &delta[2]],
        )
        .map_err(refusal_or_sql(name, "recording what a host uses"))?;
    if updated == 0 {
        return Err(StoreError::Refused {
            store: name.to_owned(),
            detail: format!("host `{host}` is not in the store"),
        });
    }
    Ok(())
}

/// Writes a host added or changed (`entry`: its row's capacity; the table's check refuses one below
/// what it uses) or removed (its row deleted, refused while anything is on it or bound for it).
/// Whether the host's row remains.
fn write_entry(
    tx: &mut Transaction<'_>,
    host: &str,
    entry: Option<&HostEntry>,
    name: &str,
) -> Result<bool, StoreError> {
    let json = entry.map(|entry| entry_json(entry, name)).transpose()?;
    match entry {
        Some(entry) => {
            let [cores, memory, ssd] = units(&entry.capacity);
            tx.execute(
                "INSERT INTO hosts (host_id, cores_cap, memory_cap, ssd_cap) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (host_id) DO UPDATE SET cores_cap = EXCLUDED.cores_cap,
                     memory_cap = EXCLUDED.memory_cap, ssd_cap = EXCLUDED.ssd_cap",
                &[&host, &cores, &memory, &ssd],
            )
            .map_err(refusal_or_sql(name, "recording a host's capacity"))?;
        }
        None => {
            let busy = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM vms WHERE host_id = $1)
                         OR EXISTS (SELECT 1 FROM migrations WHERE target_host_id = $1)",
                    &[&host],
                )
                .map_err(refusal_or_sql(name, "removing a host"))?
                .get::<_, bool>(0);
            if busy {
                return Err(StoreError::Refused {
                    store: name.to_owned(),
                    detail: format!("host `{host}` still has VMs; it is not removed"),
                });
            }
            tx.execute("DELETE FROM hosts WHERE host_id = $1", &[&host])
                .map_err(refusal_or_sql(name, "removing a host"))?;
        }
    }
    tx.execute(
        "INSERT INTO inventory (host_id, pos, entry) VALUES ($1, nextval('inventory_seq'), $2)
         ON CONFLICT (host_id) DO UPDATE SET pos = EXCLUDED.pos, entry = EXCLUDED.entry",
        &[&host, &json],
    )
    .map_err(refusal_or_sql(name, "recording the inventory"))?;
    Ok(entry.is_some())
}
