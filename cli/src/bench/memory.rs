//! The memory a measurement runs on: one buffer per rank, either ringreduce's `GpuBuffer`s
//! (`cuMemAlloc`, what both libraries use by default) or NCCL's symmetric memory
//! ([`SymmetricBuffers`]: `ncclMemAlloc` + registered windows), seen the same way — as
//! `GpuViewMut`s of the first `count` elements of every rank, written and read from the host.
//!
//! Invariant: the views always start at offset 0 of every rank's buffer, so on symmetric memory
//! every rank passes the same offset into its window, as NCCL's symmetric kernels require.

use super::library::Lib;
use ringreduce::verify::compare;
use ringreduce::Error;
use ringreduce::{Element, GpuBuffer, GpuViewMut};
use ringreduce_cli::baseline::SymmetricBuffers;

/// What one rank must hold: `None` (not checked) or the element offset and the values there.
pub(super) type Expected<T> = Option<(usize, std::rc::Rc<Vec<T>>)>;

/// Where the buffers come from: `cuMemAlloc` (ringreduce's `GpuBuffer`), or NCCL's symmetric
/// memory (`ncclMemAlloc` + window registration; NCCL only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    Plain,
    Symmetric,
}

/// One buffer per rank, of either kind.
pub(super) enum RankMemory<'a, T: Element> {
    Plain(Vec<GpuBuffer<T>>),
    Symmetric(SymmetricBuffers<'a, T>),
}

impl<'a, T: Element> RankMemory<'a, T> {
    /// `count` zeroed elements per rank.
    pub(super) fn zeroed(
        lib: &Lib<'a>,
        memory: Memory,
        devices: &[usize],
        count: usize,
    ) -> Result<Self, Error> {
        match (memory, lib) {
            (Memory::Symmetric, Lib::Nccl(n)) => {
                let mut bufs = n.symmetric_buffers(count)?;
                let zeros = vec![T::zeroed(); count];
                for rank in 0..devices.len() {
                    bufs.write(rank, &zeros)?;
                }
                Ok(RankMemory::Symmetric(bufs))
            }
            (Memory::Symmetric, Lib::Ring(_)) => Err(ringreduce::Error::InvalidArgument(
                "symmetric memory is NCCL's".into(),
            )),
            (Memory::Plain, _) => Ok(RankMemory::Plain(
                devices
                    .iter()
                    .map(|&d| GpuBuffer::zeroed(d, count))
                    .collect::<ringreduce::Result<_>>()?,
            )),
        }
    }

    /// The first `count` elements of every rank's buffer.
    pub(super) fn views_mut(&mut self, count: usize) -> ringreduce::Result<Vec<GpuViewMut<'_, T>>> {
        match self {
            RankMemory::Plain(b) => b.iter_mut().map(|b| b.view_mut(0, count)).collect(),
            RankMemory::Symmetric(s) => s.views_mut(count),
        }
    }

    /// Overwrites every rank's buffer from the start with `data[rank]`.
    pub(super) fn write_all(&mut self, data: &[Vec<T>]) -> ringreduce::Result<()> {
        for (rank, d) in data.iter().enumerate() {
            match self {
                RankMemory::Plain(b) if b[rank].len() == d.len() => b[rank].copy_from_host(d)?,
                RankMemory::Plain(b) => {
                    let mut full = b[rank].to_host()?;
                    full[..d.len()].copy_from_slice(d);
                    b[rank].copy_from_host(&full)?;
                }
                RankMemory::Symmetric(s) => s.write(rank, d)?,
            }
        }
        Ok(())
    }

    /// Compares every rank's first `want.len()` elements with `want`; the number wrong.
    pub(super) fn count_wrong(&self, want: &[T]) -> ringreduce::Result<u64> {
        let want = std::rc::Rc::new(want.to_vec());
        let each: Vec<Expected<T>> = (0..self.ranks()).map(|_| Some((0, want.clone()))).collect();
        self.count_wrong_each(&each)
    }

    /// Compares each rank's elements `at..at + values.len()` with `values` where `expect[rank]`
    /// is `Some((at, values))` (ranks with `None` are not checked); the number wrong.
    pub(super) fn count_wrong_each(&self, expect: &[Expected<T>]) -> ringreduce::Result<u64> {
        let mut wrong = 0u64;
        for (rank, e) in expect.iter().enumerate().take(self.ranks()) {
            let Some((at, want)) = e else { continue };
            let end = at + want.len();
            let got = match self {
                RankMemory::Plain(b) => {
                    let mut v = b[rank].to_host()?;
                    v.truncate(end);
                    v
                }
                RankMemory::Symmetric(s) => s.read(rank, end)?,
            };
            let got = got.get(*at..).unwrap_or(&[]);
            let (w, first) = compare(rank, got, want, 3);
            wrong += w as u64;
            for m in first {
                eprintln!(
                    "ringreduce bench: wrong element {m} (index from element {at}; {} elements)",
                    want.len()
                );
            }
        }
        Ok(wrong)
    }

    fn ranks(&self) -> usize {
        match self {
            RankMemory::Plain(b) => b.len(),
            RankMemory::Symmetric(s) => s.ranks(),
        }
    }
}
