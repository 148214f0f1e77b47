//! The three trace sources behind one iterator.

#[cfg(feature = "azure-sqlite")]
use crate::azure_sqlite::AzureSqliteReader;
use crate::azure_sqlite::MachineType;
use crate::csv_format::CsvTraceReader;
use crate::error::TraceError;
use crate::record::VmRecord;
use crate::synthetic::{generate, SyntheticConfig};
use std::path::{Path, PathBuf};

/// Where records come from.
#[derive(Clone, Debug)]
pub enum TraceSource {
    /// The project's CSV, `.csv` or `.csv.gz`.
    Csv(PathBuf),
    /// The Azure packing trace 2020 sqlite, mapped onto one machine type.
    AzureSqlite { path: PathBuf, machine: MachineType },
    /// The seeded synthetic generator.
    Synthetic(SyntheticConfig),
}

impl TraceSource {
    /// Picks the source by file extension: `.csv`/`.csv.gz` or `.sqlite`/`.db` (which needs a machine).
    pub fn from_path(path: impl AsRef<Path>, machine: Option<MachineType>) -> Result<Self, TraceError> {
        let path = path.as_ref().to_owned();
        let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
        if name.ends_with(".csv") || name.ends_with(".csv.gz") {
            Ok(TraceSource::Csv(path))
        } else if name.ends_with(".sqlite") || name.ends_with(".db") {
            let machine = machine.ok_or_else(|| {
                TraceError::AzureTrace(
                    "a sqlite trace needs the machine type to map its fractional resources onto".to_owned(),
                )
            })?;
            Ok(TraceSource::AzureSqlite { path, machine })
        } else {
            Err(TraceError::UnsupportedFormat(path))
        }
    }

    pub fn open(&self) -> Result<TraceReader, TraceError> {
        Ok(match self {
            TraceSource::Csv(path) => TraceReader::Csv(Box::new(CsvTraceReader::open(path)?)),
            #[cfg(feature = "azure-sqlite")]
            TraceSource::AzureSqlite { path, machine } => {
                TraceReader::AzureSqlite(AzureSqliteReader::open(path, machine)?)
            }
            #[cfg(not(feature = "azure-sqlite"))]
            TraceSource::AzureSqlite { path, .. } => return Err(TraceError::SqliteNotBuilt(path.clone())),
            TraceSource::Synthetic(config) => TraceReader::Synthetic(generate(config).into_iter()),
        })
    }
}

/// An iterator of [`VmRecord`]s from any source.
pub enum TraceReader {
    // Boxed: the CSV reader is large next to the other variants (without the sqlite reader, by far).
    Csv(Box<CsvTraceReader>),
    #[cfg(feature = "azure-sqlite")]
    AzureSqlite(AzureSqliteReader),
    Synthetic(std::vec::IntoIter<VmRecord>),
}

impl TraceReader {
    /// Records the source skipped on purpose (sqlite VMs whose type the chosen machine cannot host).
    pub fn skipped(&self) -> u64 {
        match self {
            #[cfg(feature = "azure-sqlite")]
            TraceReader::AzureSqlite(reader) => reader.skipped(),
            TraceReader::Csv(_) | TraceReader::Synthetic(_) => 0,
        }
    }
}

impl Iterator for TraceReader {
    type Item = Result<VmRecord, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            TraceReader::Csv(reader) => reader.next(),
            #[cfg(feature = "azure-sqlite")]
            TraceReader::AzureSqlite(reader) => reader.next(),
            TraceReader::Synthetic(records) => records.next().map(Ok),
        }
    }
}
