//! TensorBoard event files, written and read without TensorFlow or `protoc`.
//!
//! An event file is a sequence of TFRecords: `u64` LE length, masked CRC32C of those 8 bytes, the data, masked CRC32C
//! of the data (mask: `((crc >> 15) | (crc << 17)) + 0xa282ead8`). Each record holds one `tensorflow.Event` protobuf,
//! encoded here by hand; the first is `file_version = "brain.Event:2"`, the others carry one scalar each:
//!
//! ```text
//! Event   { wall_time: double = 1, step: int64 = 2, file_version: string = 3, summary: Summary = 5 }
//! Summary { value: repeated Value = 1 }
//! Value   { tag: string = 1, simple_value: float = 2 }
//! ```

use crate::error::{io, Error, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The `file_version` of the first event, as TensorBoard expects it.
pub const FILE_VERSION: &str = "brain.Event:2";

/// Appends scalars to a new TensorBoard event file.
///
/// Records are buffered; [`flush`](Self::flush) hands them to the OS (dropping the writer flushes too, ignoring
/// errors). TensorBoard reads every `*tfevents*` file of a directory, so a resumed run simply adds a new file.
#[derive(Debug)]
pub struct SummaryWriter {
    path: PathBuf,
    out: BufWriter<File>,
    record: Vec<u8>,
}

impl SummaryWriter {
    /// Creates `dir` (and its parents) and in it `events.out.tfevents.<unix secs>.<hostname>` (with a numeric suffix
    /// should that name exist), and writes the `file_version` event.
    pub fn create(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        fs::create_dir_all(dir).map_err(io(dir))?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let host = rustix::system::uname().nodename().to_string_lossy().into_owned();
        let base = format!("events.out.tfevents.{}.{host}", now.as_secs());
        let mut suffix = 0u32;
        let (path, file) = loop {
            let name = match suffix {
                0 => base.clone(),
                n => format!("{base}.{n}"),
            };
            let path = dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => suffix += 1,
                Err(e) => return Err(io(&path)(e)),
            }
        };
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
            record: Vec::new(),
        };
        writer.write_event(now.as_secs_f64(), 0, Body::FileVersion(FILE_VERSION))?;
        writer.flush()?;
        Ok(writer)
    }

    /// The event file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `value` under `tag` (e.g. `"reward/mean"`) at `step`, stamped with the current wall time.
    pub fn add_scalar(&mut self, tag: &str, value: f32, step: i64) -> Result<()> {
        let wall_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.write_event(wall_time, step, Body::Scalar { tag, value })
    }

    /// Writes the buffered records to the file.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(io(&self.path))
    }

    fn write_event(&mut self, wall_time: f64, step: i64, body: Body<'_>) -> Result<()> {
        let event = encode_event(wall_time, step, body);
        self.record.clear();
        frame_record(&event, &mut self.record);
        self.out.write_all(&self.record).map_err(io(&self.path))
    }
}

/// Reads every scalar of an event file as `(tag, step, value)`, in file order, verifying both CRCs of every record.
/// A corrupt record is an error naming the file and the record's offset. A last record cut short (a run killed,
/// or stopped by a full disk, in the middle of a write) ends the file, as TensorBoard reads it: the records before
/// it are read.
pub fn read_scalars(path: impl AsRef<Path>) -> Result<Vec<(String, i64, f32)>> {
    let path = path.as_ref();
    let bytes = fs::read(path).map_err(io(path))?;
    let bad = |offset: usize, reason: String| Error::CorruptEvents {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason,
    };
    let mut scalars = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let data = match unframe_record(&bytes[pos..]) {
            Ok(data) => data,
            Err(Unframed::Truncated) => break,
            Err(Unframed::Corrupt(r)) => return Err(bad(pos, r)),
        };
        let event = decode_event(data).map_err(|r| bad(pos, format!("bad Event protobuf: {r}")))?;
        scalars.extend(
            event
                .scalars
                .into_iter()
                .map(|(tag, value)| (tag, event.step, value)),
        );
        pos += data.len() + 16;
    }
    Ok(scalars)
}

/// CRC32C as TFRecord stores it.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn frame_record(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// Why the bytes at an offset are not a record.
#[derive(Debug)]
enum Unframed {
    /// The buffer ends before the record does.
    Truncated,
    /// A CRC does not match.
    Corrupt(String),
}

/// The data of the record at the start of `buf`, both CRCs checked.
fn unframe_record(buf: &[u8]) -> Result<&[u8], Unframed> {
    let le_u32 = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if buf.len() < 12 {
        return Err(Unframed::Truncated);
    }
    let (len_bytes, rest) = buf.split_at(8);
    if le_u32(rest) != masked_crc(len_bytes) {
        return Err(Unframed::Corrupt("length CRC mismatch".into()));
    }
    let len = u64::from_le_bytes([
        len_bytes[0],
        len_bytes[1],
        len_bytes[2],
        len_bytes[3],
        len_bytes[4],
        len_bytes[5],
        len_bytes[6],
        len_bytes[7],
    ]);
    let rest = &rest[4..];
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l.checked_add(4).is_some_and(|n| n <= rest.len()))
        .ok_or(Unframed::Truncated)?;
    let (data, crc) = rest.split_at(len);
    if le_u32(crc) != masked_crc(data) {
        return Err(Unframed::Corrupt("data CRC mismatch".into()));
    }
    Ok(data)
}

enum Body<'a> {
    FileVersion(&'a str),
    Scalar { tag: &'a str, value: f32 },
}

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const BYTES: u32 = 2;
const FIXED32: u32 = 5;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(out, u64::from(field << 3 | wire));
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, BYTES);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn encode_event(wall_time: f64, step: i64, body: Body<'_>) -> Vec<u8> {
    let mut ev = Vec::with_capacity(64);
    put_key(&mut ev, 1, FIXED64);
    ev.extend_from_slice(&wall_time.to_le_bytes());
    if step != 0 {
        put_key(&mut ev, 2, VARINT);
        put_varint(&mut ev, step as u64);
    }
    match body {
        Body::FileVersion(v) => put_bytes(&mut ev, 3, v.as_bytes()),
        Body::Scalar { tag, value } => {
            let mut val = Vec::with_capacity(tag.len() + 8);
            put_bytes(&mut val, 1, tag.as_bytes());
            put_key(&mut val, 2, FIXED32);
            val.extend_from_slice(&value.to_le_bytes());
            let mut summary = Vec::with_capacity(val.len() + 2);
            put_bytes(&mut summary, 1, &val);
            put_bytes(&mut ev, 5, &summary);
        }
    }
    ev
}

/// The parts of an Event this crate reads back.
#[derive(Debug, Default, PartialEq)]
struct Event {
    wall_time: f64,
    step: i64,
    file_version: Option<String>,
    scalars: Vec<(String, f32)>,
}

enum Field<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

/// Iterates over `(field number, value)` of a protobuf message.
struct Fields<'a> {
    buf: &'a [u8],
}

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.buf.split_first().ok_or("truncated varint")?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.buf.len() {
            return Err(format!("field of {n} bytes, {} left", self.buf.len()));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn field(&mut self) -> Result<(u64, Field<'a>), String> {
        let key = self.varint()?;
        let field = match (key & 7) as u32 {
            VARINT => Field::Varint(self.varint()?),
            FIXED64 => Field::Fixed64(self.take(8)?.try_into().map_err(|_| "fixed64")?),
            BYTES => {
                let n = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
                Field::Bytes(self.take(n)?)
            }
            FIXED32 => Field::Fixed32(self.take(4)?.try_into().map_err(|_| "fixed32")?),
            w => return Err(format!("unsupported wire type {w}")),
        };
        Ok((key >> 3, field))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Field<'a>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        (!self.buf.is_empty()).then(|| self.field())
    }
}

fn utf8(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "string is not UTF-8".to_string())
}

fn decode_event(buf: &[u8]) -> Result<Event, String> {
    let mut ev = Event::default();
    for f in (Fields { buf }) {
        match f? {
            (1, Field::Fixed64(b)) => ev.wall_time = f64::from_le_bytes(b),
            (2, Field::Varint(v)) => ev.step = v as i64,
            (3, Field::Bytes(b)) => ev.file_version = Some(utf8(b)?),
            (5, Field::Bytes(summary)) => {
                for v in (Fields { buf: summary }) {
                    if let (1, Field::Bytes(value)) = v? {
                        let (mut tag, mut simple) = (None, None);
                        for x in (Fields { buf: value }) {
                            match x? {
                                (1, Field::Bytes(t)) => tag = Some(utf8(t)?),
                                (2, Field::Fixed32(b)) => simple = Some(f32::from_le_bytes(b)),
                                _ => {}
                            }
                        }
                        if let (Some(t), Some(s)) = (tag, simple) {
                            ev.scalars.push((t, s));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of the first record of an event file: its data, its length and the two CRCs.
    fn first_record_len(bytes: &[u8]) -> usize {
        let len: [u8; 8] = bytes[..8].try_into().unwrap();
        u64::from_le_bytes(len) as usize + 16
    }

    fn only_file(dir: &Path) -> PathBuf {
        let mut files: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 1);
        files.pop().unwrap()
    }

    #[test]
    fn crc32c_and_mask_match_known_values() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // ((0xe3069283 >> 15) | (0xe3069283 << 17)) + 0xa282ead8, worked out by hand.
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    }

    #[test]
    fn event_round_trips_with_negative_and_large_steps() {
        for step in [0, 1, 127, 128, 1 << 40, -1, i64::MIN, i64::MAX] {
            let buf = encode_event(
                1.5,
                step,
                Body::Scalar {
                    tag: "a/b",
                    value: -0.25,
                },
            );
            let ev = decode_event(&buf).unwrap();
            assert_eq!(ev.step, step);
            assert_eq!(ev.wall_time, 1.5);
            assert_eq!(ev.scalars, vec![("a/b".to_string(), -0.25)]);
        }
        let ev = decode_event(&encode_event(2.0, 0, Body::FileVersion(FILE_VERSION))).unwrap();
        assert_eq!(ev.file_version.as_deref(), Some(FILE_VERSION));
        assert!(ev.scalars.is_empty());
    }

    #[test]
    fn writer_output_reads_back_with_file_version_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = SummaryWriter::create(dir.path().join(".summary/0")).unwrap();
        let name = w.path().file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        w.add_scalar("reward", 1.0, 10).unwrap();
        w.add_scalar("loss", f32::NAN, 20).unwrap();
        w.flush().unwrap();
        let bytes = fs::read(w.path()).unwrap();
        let first = decode_event(unframe_record(&bytes).unwrap()).unwrap();
        assert_eq!(first.file_version.as_deref(), Some(FILE_VERSION));
        let s = read_scalars(w.path()).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], ("reward".to_string(), 10, 1.0));
        assert_eq!((s[1].0.as_str(), s[1].1), ("loss", 20));
        assert!(s[1].2.is_nan());
    }

    #[test]
    fn two_writers_in_one_second_get_distinct_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = SummaryWriter::create(dir.path()).unwrap();
        let b = SummaryWriter::create(dir.path()).unwrap();
        assert_ne!(a.path(), b.path());
    }

    #[test]
    fn corruption_is_an_error_naming_the_file_and_a_last_record_cut_short_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = SummaryWriter::create(dir.path()).unwrap();
        w.add_scalar("x", 3.0, 1).unwrap();
        drop(w);
        let path = only_file(dir.path());
        let good = fs::read(&path).unwrap();

        let mut flipped = good.clone();
        let last = flipped.len() - 6;
        flipped[last] ^= 1;
        fs::write(&path, &flipped).unwrap();
        let err = read_scalars(&path).unwrap_err().to_string();
        assert!(
            err.contains(&*path.to_string_lossy()) && err.contains("data CRC"),
            "{err}"
        );

        for cut in [3, good.len() - first_record_len(&good) - 5] {
            fs::write(&path, &good[..good.len() - cut]).unwrap();
            assert_eq!(read_scalars(&path).unwrap(), Vec::new(), "{cut} bytes cut");
        }
        fs::write(&path, &good).unwrap();
        assert_eq!(read_scalars(&path).unwrap(), vec![("x".to_owned(), 1, 3.0)]);

        let mut bad_len = good.clone();
        bad_len[0] ^= 0x40;
        fs::write(&path, &bad_len).unwrap();
        let err = read_scalars(&path).unwrap_err().to_string();
        assert!(err.contains("byte 0: length CRC"), "{err}");
    }
}
