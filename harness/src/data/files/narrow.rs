//! Inputs held as f32, the dtype nearly every dataset stores: a view of a
//! mapped file's values, read in place (a scan then touches each byte once,
//! with no f64 copy of the chunk), or values copied in where the file's
//! bytes cannot be viewed (misaligned, big-endian, or several sources).

use memmap2::Mmap;
use std::ops::Range;
use std::sync::Arc;

/// A file's bytes: mapped, or pinned in memory by a loading run.
pub enum Bytes {
    Mapped(Mmap),
    Pinned(Arc<[u8]>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Pinned(b) => b,
        }
    }
}

pub const PAGE: usize = 4096;

impl Bytes {
    /// Gives the whole pages of `range` back to the OS (mapped bytes only;
    /// pinned bytes stay whole until the load drops them): the map then
    /// holds what the scan is reading, not the file.
    pub fn release(&self, range: Range<usize>) {
        let Bytes::Mapped(map) = self else {
            return;
        };
        let (from, end) = (range.start / PAGE * PAGE, range.end / PAGE * PAGE);
        if end > from {
            // SAFETY: the map is a read-only view of a file: a page given
            // back and read again is read from the file again, the same
            // bytes (samples are read in order, so that is rare).
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, end - from)
            };
        }
    }
}

/// f32 values within a file's bytes; dropping it releases its pages.
struct View {
    bytes: Arc<Bytes>,
    range: Range<usize>,
}

impl View {
    fn values(&self) -> &[f32] {
        bytemuck::cast_slice(&self.bytes[self.range.clone()])
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.bytes.release(self.range.clone());
    }
}

/// f32 inputs of a chunk: a view of the file or values of its own.
#[derive(Default)]
pub struct Narrow {
    view: Option<View>,
    owned: Vec<f32>,
}

impl Clone for Narrow {
    /// A copy of the values (a shared view would release pages in use).
    fn clone(&self) -> Self {
        Narrow {
            view: None,
            owned: self.as_slice().to_vec(),
        }
    }
}

impl std::fmt::Debug for Narrow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Narrow({} values", self.len())?;
        f.write_str(if self.view.is_some() {
            ", in place)"
        } else {
            ")"
        })
    }
}

impl Narrow {
    /// The values.
    pub fn as_slice(&self) -> &[f32] {
        match &self.view {
            Some(v) => v.values(),
            None => &self.owned,
        }
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the values are read in place from a file.
    pub fn in_place(&self) -> bool {
        self.view.is_some()
    }

    /// Empties it.
    pub fn clear(&mut self) {
        self.view = None;
        self.owned.clear();
    }

    /// Copies a view held into values of its own, to append to them.
    fn own(&mut self) {
        if let Some(v) = self.view.take() {
            self.owned.extend_from_slice(v.values());
        }
    }

    /// Appends values (a view held so far is copied first).
    pub fn extend_from_slice(&mut self, values: &[f32]) {
        self.own();
        self.owned.extend_from_slice(values);
    }

    /// Appends the little-endian f32 values in `range` of `bytes`: in place
    /// where they are aligned and follow the values held, else copied.
    pub fn extend_from_file(&mut self, bytes: &Arc<Bytes>, range: Range<usize>) {
        let raw = &bytes[range.clone()];
        let viewable = cfg!(target_endian = "little")
            && bytemuck::try_cast_slice::<u8, f32>(raw).is_ok()
            && self.owned.is_empty();
        match &mut self.view {
            Some(v) if viewable && Arc::ptr_eq(&v.bytes, bytes) && v.range.end == range.start => {
                v.range.end = range.end;
            }
            None if viewable => {
                self.view = Some(View {
                    bytes: bytes.clone(),
                    range,
                });
            }
            _ => {
                self.own();
                let values = raw.chunks_exact(4);
                self.owned
                    .extend(values.map(|b| f32::from_le_bytes(b.try_into().expect("four bytes"))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(values: &[f32]) -> Arc<Bytes> {
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Arc::new(Bytes::Pinned(Arc::from(raw)))
    }

    #[test]
    fn contiguous_reads_stay_in_place_and_others_are_copied() {
        let values: Vec<f32> = (0..64).map(|i| i as f32 * 0.5).collect();
        let bytes = bytes_of(&values);
        let mut n = Narrow::default();
        n.extend_from_file(&bytes, 0..40);
        n.extend_from_file(&bytes, 40..128);
        assert!(n.in_place());
        assert_eq!(n.as_slice(), &values[..32]);
        // A gap: the values so far are copied, then the new ones.
        n.extend_from_file(&bytes, 160..168);
        assert!(!n.in_place());
        assert_eq!(n.len(), 34);
        assert_eq!(&n.as_slice()[32..], &values[40..42]);
        // Misaligned bytes are copied too.
        let mut m = Narrow::default();
        let raw: Vec<u8> = std::iter::once(0u8)
            .chain(values.iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        let odd = Arc::new(Bytes::Pinned(Arc::from(raw)));
        m.extend_from_file(&odd, 1..17);
        assert_eq!(m.as_slice(), &values[..4]);
        assert!(!m.in_place());
        let copy = n.clone();
        assert_eq!(copy.as_slice(), n.as_slice());
    }
}
