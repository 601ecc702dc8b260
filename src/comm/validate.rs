//! What every call checks before anything is enqueued: buffer count, lengths compared across all
//! ranks, placement (host or the rank's own GPU), overlap between an output and an input and
//! between ranks' outputs, and the byte count. Each failure is its own [`Error`] variant naming
//! the rank; nothing has been touched when one is returned.

use super::Communicator;
use crate::buffer::{Buffer, Placement};
use crate::element::Element;
use crate::error::{Error, Result};

impl Communicator {
    /// Checks the arguments against each other and the communicator; returns the element count.
    pub(super) fn validate<T: Element, O: Buffer<T>>(
        &self,
        outputs: &[O],
        inputs: Option<&[impl Buffer<T>]>,
    ) -> Result<usize> {
        if outputs.is_empty() || inputs.is_some_and(|i| i.is_empty()) {
            return Err(Error::NoBuffers);
        }
        let sizes = |n: usize| {
            if n == self.world {
                Ok(())
            } else {
                Err(Error::WorldMismatch {
                    world: self.world,
                    got: n,
                })
            }
        };
        sizes(outputs.len())?;
        if let Some(inputs) = inputs {
            sizes(inputs.len())?;
        }
        let source_len = |r: usize| inputs.map_or(outputs[r].count(), |i| i[r].count());
        let count = source_len(0);
        for r in 1..self.world {
            if source_len(r) != count {
                return Err(Error::LengthMismatch {
                    rank: r,
                    expected: count,
                    got: source_len(r),
                });
            }
        }
        // No object exceeds isize::MAX bytes (Rust's and every allocator's limit).
        count
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&bytes| bytes <= isize::MAX as usize)
            .ok_or(Error::SizeOverflow {
                count,
                dtype: T::DTYPE,
            })?;
        let devices = self.devices();
        let placement = |p: Placement, rank: usize| match (p, devices.get(rank)) {
            (Placement::Host, None) => Ok(()),
            (Placement::Device(_), None) => Err(Error::WrongPlacement {
                rank,
                got: p,
                expected: "host memory (this is a host communicator)",
            }),
            (Placement::Host, Some(_)) => Err(Error::WrongPlacement {
                rank,
                got: p,
                expected: "device memory (this is a GPU communicator)",
            }),
            (Placement::Device(device), Some(&expected)) if device != expected => {
                Err(Error::WrongDevice {
                    rank,
                    device,
                    expected,
                })
            }
            (Placement::Device(_), Some(_)) => Ok(()),
        };
        // Byte range of a buffer's first `len` elements (saturating: a bogus address near the
        // top of the address space must not overflow here).
        let bytes = |b: &dyn Buffer<T>, len: usize| {
            let start = b.address();
            (
                start,
                start.saturating_add((len * std::mem::size_of::<T>()) as u64),
            )
        };
        for (rank, out) in outputs.iter().enumerate() {
            placement(out.placement(), rank)?;
            let (o0, o1) = bytes(out, count);
            for (q, other) in outputs[..rank].iter().enumerate() {
                let (p0, p1) = bytes(other, count);
                if count > 0 && o0 < p1 && p0 < o1 {
                    return Err(Error::OutputsOverlap {
                        first: q,
                        second: rank,
                    });
                }
            }
            if let Some(inputs) = inputs {
                placement(inputs[rank].placement(), rank)?;
                if out.count() < count {
                    return Err(Error::OutputTooShort {
                        rank,
                        input: count,
                        output: out.count(),
                    });
                }
                for input in inputs {
                    let (i0, i1) = bytes(input, count);
                    if count > 0 && o0 < i1 && i0 < o1 {
                        return Err(Error::Overlap { rank });
                    }
                }
            }
        }
        Ok(count)
    }
}
