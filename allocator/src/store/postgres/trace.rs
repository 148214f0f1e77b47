//! The PostgreSQL store's trace export: placements and exits read in one snapshot, on a
//! connection of its own, a page of rows at a time.

use super::*;
use domain::RequestDetails;

/// The columns an export reads: the start on the model's clock, [`VmColumns`] without the
/// prediction (a trace has none), the end (NULL: still running).
const EXPORT_COLUMNS: &str = "seq, vm_id, host_id, tenant_id, vm_type, cores_base, memory_base, ssd_base, placed_at_s,
                              NULL::text, requested_at_s, request";

/// How many rows an export fetches at a time.
const EXPORT_FETCH: i32 = 2_000;

/// Exports the VMs of the database at `url` that started in `window` ([`super::export`]): a
/// connection of its own, one repeatable-read snapshot (a VM released meanwhile is read once,
/// running or exited), rows fetched [`EXPORT_FETCH`] at a time through portals.
pub fn export(url: &str, window: &ExportWindow, sink: &mut dyn ExportSink) -> Result<u64, ExportError> {
    let name = redact(url);
    let sql = |context: &'static str| {
        let name = name.clone();
        move |source: postgres::Error| StoreError::Sql { store: name, context, source: source.into() }
    };
    // The agents' connection settings: an export from a primary that vanishes fails, not hangs.
    let (mut client, _) = connect(url, &name)?;
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(sql("starting to read the export"))?;
    let (from, to) = (window.from_s, window.to_s);
    const RUNNING: &str = "FROM vms WHERE COALESCE(requested_at_s, placed_at_s) >= $1
                           AND COALESCE(requested_at_s, placed_at_s) < $2";
    const EXITED: &str = "FROM exits WHERE start_s >= $1 AND start_s < $2";
    let count: i64 = tx
        .query_one(&format!("SELECT (SELECT COUNT(*) {RUNNING}) + (SELECT COUNT(*) {EXITED})"), &[&from, &to])
        .map_err(sql("counting the export's rows"))?
        .get(0);
    // The keys of the rows' request JSON at `path` (the details' names; `-> 'features'`).
    let mut keys = |path: &str, limit: usize, context: &'static str| -> Result<Vec<String>, StoreError> {
        let rows = tx
            .query(
                &format!(
                    "SELECT jsonb_object_keys(request::jsonb{path}) {RUNNING} AND request IS NOT NULL
                     UNION
                     SELECT jsonb_object_keys(request::jsonb{path}) {EXITED} AND request IS NOT NULL
                     LIMIT {limit}"
                ),
                &[&from, &to],
            )
            .map_err(sql(context))?;
        Ok(rows.into_iter().map(|row| row.get(0)).collect())
    };
    let details = keys("", RequestDetails::names().len(), "reading the export's detail names")?;
    let features =
        keys(" -> 'features'", crate::store::export::MAX_FEATURE_COLUMNS + 1, "reading the export's feature names")?;
    sink.header(&ExportHeader::new(window, count.max(0) as u64, details, features)?)?;
    let running = tx
        .bind(
            &format!(
                "SELECT COALESCE(requested_at_s, placed_at_s), {EXPORT_COLUMNS}, NULL::float8 {RUNNING}
                 ORDER BY COALESCE(requested_at_s, placed_at_s), seq"
            ),
            &[&from, &to],
        )
        .map_err(sql("reading the running VMs"))?;
    let exited = tx
        .bind(&format!("SELECT start_s, {EXPORT_COLUMNS}, ended_at_s {EXITED} ORDER BY start_s, seq"), &[&from, &to])
        .map_err(sql("reading the exits"))?;
    // Both portals are fetched from one transaction, a batch at a time, as the merge asks.
    let tx = std::cell::RefCell::new(tx);
    let fetch = |portal: &postgres::Portal, context: &'static str| {
        let name = name.clone();
        let tx = &tx;
        let mut buffered: std::collections::VecDeque<postgres::Row> = std::collections::VecDeque::new();
        let mut done = false;
        let portal = portal.clone();
        std::iter::from_fn(move || -> Option<Result<ExportedVm, ExportError>> {
            if buffered.is_empty() && !done {
                match tx.borrow_mut().query_portal(&portal, EXPORT_FETCH) {
                    Ok(rows) => {
                        done = rows.len() < EXPORT_FETCH as usize;
                        buffered.extend(rows);
                    }
                    Err(source) => {
                        done = true;
                        return Some(Err(
                            StoreError::Sql { store: name.clone(), context, source: source.into() }.into()
                        ));
                    }
                }
            }
            let row = buffered.pop_front()?;
            let columns = vm_columns(&row, 1);
            let (start_s, ended_at_s, seq) = (row.get(0), row.get(13), columns.seq);
            Some(columns.decode(&name).map_err(ExportError::from).map(|stored| ExportedVm {
                start_s,
                seq,
                vm: stored.vm,
                ended_at_s,
            }))
        })
    };
    let written = crate::store::export::merge(
        fetch(&running, "reading the running VMs"),
        fetch(&exited, "reading the exits"),
        window.max_rows,
        sink,
    )?;
    tx.into_inner().commit().map_err(sql("finishing the export"))?;
    Ok(written)
}
