//! Reading a compressed trace with gunzip on a thread of its own, a few chunks ahead of the CSV
//! parser: on two cores the two overlap, which a data frame read pays for in wall time. The parse
//! is `traces`' own (`CsvTraceReader::from_reader`), so the records are the same.

use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver};

const CHUNK: usize = 1 << 18;
/// Chunks decompressed ahead of the parser: enough to keep both busy, little memory.
const AHEAD: usize = 4;

/// The decompressed bytes of a `.gz` file, read on another thread.
pub struct ReadAhead {
    chunks: Receiver<io::Result<Vec<u8>>>,
    current: Vec<u8>,
    pos: usize,
}

impl ReadAhead {
    /// Opens `path`; `None` when no thread can be started (the caller then reads in line).
    pub fn gzip(path: &Path) -> io::Result<Option<Self>> {
        let mut input = MultiGzDecoder::new(BufReader::with_capacity(1 << 16, File::open(path)?));
        let (sender, chunks) = sync_channel(AHEAD);
        let spawned = std::thread::Builder::new().name("gunzip".to_owned()).spawn(move || loop {
            let mut chunk = vec![0; CHUNK];
            let sent = match input.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => {
                    chunk.truncate(n);
                    sender.send(Ok(chunk))
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => sender.send(Err(error)),
            };
            // The reader was dropped (or failed): stop decompressing.
            if sent.is_err() {
                return;
            }
        });
        Ok(spawned.ok().map(|_| ReadAhead { chunks, current: Vec::new(), pos: 0 }))
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            match self.chunks.recv() {
                Ok(chunk) => {
                    self.current = chunk?;
                    self.pos = 0;
                }
                // The thread ended: the whole file was read.
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len() - self.pos);
        out[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
