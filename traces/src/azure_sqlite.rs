//! The Azure packing trace 2020 (sqlite), mapped onto one machine type.
//!
//! Tables: `vm(vmId, tenantId, vmTypeId, priority, starttime, endtime)` and
//! `vmType(id, vmTypeId, machineId, core, memory, hdd, ssd, nic)`. Resources are fractions of a
//! machine of type `machineId`, times are days (negative: running before the trace starts), and a
//! NULL `endtime` means still running at the end. A VM type that the chosen machine type cannot host
//! has no `vmType` row for it; such VMs are skipped and counted ([`AzureSqliteReader::skipped`]).
//!
//! Priority 1 is read as regular (high) priority and 0 as low (evictable) priority.
//!
//! The reader needs the `azure-sqlite` feature (rusqlite, on by default for this crate and its
//! `vmtrace` binary); crates that only read the project's CSV leave it off and link no SQLite.

#[cfg(feature = "azure-sqlite")]
pub use reader::AzureSqliteReader;

/// The machine type the fractional resources are expressed against, with its absolute size.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineType {
    pub machine_id: i64,
    pub cores: f64,
    pub memory_gib: f64,
    pub ssd_gib: f64,
}

#[cfg(feature = "azure-sqlite")]
mod reader {
    use super::MachineType;
    use crate::error::TraceError;
    use crate::record::{ExtraColumns, VmRecord};
    use domain::Priority;
    use rusqlite::{Connection, OpenFlags};
    use std::collections::{HashMap, VecDeque};
    use std::path::Path;

    const SECONDS_PER_DAY: f64 = 86_400.0;
    /// Rows fetched per query; keeps memory flat on the multi-million-row trace.
    const PAGE_ROWS: i64 = 50_000;

    /// Absolute demand of one VM type on the chosen machine.
    #[derive(Clone, Copy, Debug)]
    struct TypeDemand {
        cores: f64,
        memory_gib: f64,
    }

    /// Streams [`VmRecord`]s out of an Azure packing-trace sqlite file, in `vm` rowid order.
    pub struct AzureSqliteReader {
        connection: Connection,
        demands: HashMap<i64, TypeDemand>,
        page: VecDeque<VmRecord>,
        last_rowid: i64,
        exhausted: bool,
        skipped: u64,
    }

    impl AzureSqliteReader {
        pub fn open(path: impl AsRef<Path>, machine: &MachineType) -> Result<Self, TraceError> {
            let path = path.as_ref();
            if !path.exists() {
                return Err(TraceError::io(path, std::io::Error::from(std::io::ErrorKind::NotFound)));
            }
            let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
            let mut demands = HashMap::new();
            {
                let mut statement =
                    connection.prepare("SELECT vmTypeId, core, memory FROM vmType WHERE machineId = ?1")?;
                let mut rows = statement.query([machine.machine_id])?;
                while let Some(row) = rows.next()? {
                    let type_id: i64 = row.get(0)?;
                    let core: f64 = row.get(1)?;
                    let memory: f64 = row.get(2)?;
                    demands.insert(
                        type_id,
                        TypeDemand { cores: core * machine.cores, memory_gib: memory * machine.memory_gib },
                    );
                }
            }
            if demands.is_empty() {
                return Err(TraceError::AzureTrace(format!(
                    "no vmType rows for machineId {}; pick a machine id present in the vmType table",
                    machine.machine_id
                )));
            }
            Ok(AzureSqliteReader {
                connection,
                demands,
                page: VecDeque::new(),
                last_rowid: i64::MIN,
                exhausted: false,
                skipped: 0,
            })
        }

        /// VMs skipped so far because their type has no `vmType` row for the chosen machine.
        pub fn skipped(&self) -> u64 {
            self.skipped
        }

        fn fetch_page(&mut self) -> Result<(), TraceError> {
            let mut statement = self.connection.prepare_cached(
                "SELECT rowid, vmId, tenantId, vmTypeId, priority, starttime, endtime FROM vm \
             WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
            )?;
            let mut rows = statement.query((self.last_rowid, PAGE_ROWS))?;
            let mut fetched = 0;
            while let Some(row) = rows.next()? {
                fetched += 1;
                self.last_rowid = row.get(0)?;
                let vm_id = id_text(row.get(1)?);
                let tenant_id = id_text(row.get(2)?);
                let type_id: i64 = row.get(3)?;
                let priority: i64 = row.get(4)?;
                let start_days: f64 = row.get(5)?;
                let end_days: Option<f64> = row.get(6)?;
                let Some(demand) = self.demands.get(&type_id) else {
                    self.skipped += 1;
                    continue;
                };
                if !start_days.is_finite() || end_days.is_some_and(|end| !end.is_finite() || end < start_days) {
                    return Err(TraceError::AzureTrace(format!(
                        "vm {vm_id}: bad times starttime={start_days} endtime={end_days:?}"
                    )));
                }
                self.page.push_back(VmRecord {
                    vm_id,
                    tenant_id,
                    vm_type: type_id.to_string(),
                    cores: demand.cores,
                    memory_gib: demand.memory_gib,
                    priority: if priority == 0 { Priority::Low } else { Priority::Regular },
                    start_s: start_days * SECONDS_PER_DAY,
                    end_s: end_days.map(|end| end * SECONDS_PER_DAY),
                    extra: ExtraColumns::default(),
                });
            }
            self.exhausted = fetched < PAGE_ROWS;
            Ok(())
        }
    }

    /// Ids are integers in the published trace; accept text too rather than fail on a re-export.
    fn id_text(value: rusqlite::types::Value) -> String {
        use rusqlite::types::Value;
        match value {
            Value::Integer(i) => i.to_string(),
            Value::Real(r) => r.to_string(),
            Value::Text(t) => t,
            Value::Blob(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::Null => String::new(),
        }
    }

    impl Iterator for AzureSqliteReader {
        type Item = Result<VmRecord, TraceError>;

        fn next(&mut self) -> Option<Self::Item> {
            while self.page.is_empty() && !self.exhausted {
                if let Err(err) = self.fetch_page() {
                    self.exhausted = true;
                    return Some(Err(err));
                }
            }
            self.page.pop_front().map(Ok)
        }
    }
}
