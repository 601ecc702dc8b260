//! The arguments of `ringreduce._native.Communicator`'s methods (python/src/communicator.rs),
//! from Python's values to the core's: indices, collectives and operators by name, transfers,
//! the one element type of a call's buffers, and the memory behind a span (host slices, device
//! memory), with the checks that name a wrong argument (`ArgumentError`).

use crate::buffer::HostBuffer;
use crate::errors::{argument, Failure};
use crate::layout::Span;
use ringreduce::{Collective, DType, DeviceMemory, Element, ReduceOp, Transfer};

/// A non-negative Python integer as an index, or `ArgumentError` naming `what`.
pub(crate) fn index(what: &str, value: i64) -> Result<usize, Failure> {
    usize::try_from(value).map_err(|_| argument(format!("{what}={value} is negative")))
}

/// The collective a method names (`all_reduce`, ..., `all_to_all`), with its root.
pub(crate) fn collective_of(name: &str, root: i64) -> Result<Collective, Failure> {
    let root = || index("root", root);
    Ok(match name {
        "all_reduce" => Collective::AllReduce,
        "reduce_scatter" => Collective::ReduceScatter,
        "all_gather" => Collective::AllGather,
        "broadcast" => Collective::Broadcast { root: root()? },
        "reduce" => Collective::Reduce { root: root()? },
        "all_to_all" => Collective::AllToAll,
        _ => return Err(argument(format!("{name:?} is not a collective"))),
    })
}

/// The operator `name` names, for a collective that reduces (others take none: `Sum` stands in,
/// as the core's calls without an operator pass it).
pub(crate) fn op_of(collective: &Collective, name: &str) -> Result<ReduceOp, Failure> {
    let op = ReduceOp::from_name(&name.to_ascii_lowercase()).ok_or_else(|| {
        argument(format!(
            "op={name:?} is not an operator: one of sum, prod, min, max, avg"
        ))
    })?;
    Ok(match collective.reduces() {
        true => op,
        false => ReduceOp::Sum,
    })
}

/// The transfers of a send/recv from Python's `(from, to, count)` triples.
pub(crate) fn transfers_of(triples: &[(i64, i64, i64)]) -> Result<Vec<Transfer>, Failure> {
    triples
        .iter()
        .map(|&(from, to, count)| {
            Ok(Transfer {
                from: index("a transfer's from", from)?,
                to: index("a transfer's to", to)?,
                count: index("a transfer's count", count)?,
            })
        })
        .collect()
}

/// The one element type of a call's buffers: `dtype` where named (each buffer was checked
/// against it), else the first buffer's, which every other buffer must share.
pub(crate) fn common_dtype(
    named: Option<DType>,
    buffers: &[(&str, &HostBuffer)],
) -> Result<DType, Failure> {
    let Some(&(first_role, first)) = buffers.first() else {
        return named.ok_or_else(|| {
            argument(
                "this rank passes no buffer to the call: pass dtype= (every rank's call must name \
                 the same type)",
            )
        });
    };
    let dtype = named.unwrap_or(first.dtype);
    match buffers.iter().find(|(_, b)| b.dtype != dtype) {
        Some((role, b)) => Err(argument(format!(
            "{role} holds {}, {first_role} {dtype}: one call moves one element type (convert, \
             or pass dtype= to reinterpret)",
            b.dtype
        ))),
        None => Ok(dtype),
    }
}

/// The memory of `span` as a slice of `T`.
///
/// # Safety
/// `span` is `count` elements of `T` of an export alive for `'a` ([`HostBuffer`]), aligned for
/// `T`, which nothing writes meanwhile.
pub(crate) unsafe fn slice<'a, T>(span: Span) -> &'a [T] {
    match span.count {
        0 => &[],
        // SAFETY: our caller's contract.
        count => unsafe { std::slice::from_raw_parts(span.address as usize as *const T, count) },
    }
}

/// The memory of `span` as a mutable slice of `T`.
///
/// # Safety
/// As for [`slice`], writable, and nothing else reads or writes it meanwhile.
pub(crate) unsafe fn slice_mut<'a, T>(span: Span) -> &'a mut [T] {
    match span.count {
        0 => &mut [],
        // SAFETY: our caller's contract.
        count => unsafe { std::slice::from_raw_parts_mut(span.address as usize as *mut T, count) },
    }
}

/// The device memory of `span` on GPU `device`.
///
/// # Safety
/// `DeviceMemory::new`'s contract: `count` elements of `T` at `address` are device memory of
/// GPU `device`, aligned for `T`, live and untouched by anything else while a call borrows it
/// and, enqueued, until its stream has passed the call.
pub(crate) unsafe fn device_memory<T: Element>(span: Span, device: usize) -> DeviceMemory<T> {
    // SAFETY: our caller's contract.
    unsafe { DeviceMemory::new(span.address, span.count, device) }
}

/// The writable buffer among `buffers` whose span `span` is, or `ArgumentError` naming the one
/// that is read-only.
pub(crate) fn writable(span: Span, buffers: &[(&str, &HostBuffer)]) -> Result<(), Failure> {
    match buffers.iter().find(|(_, b)| b.span() == span) {
        Some((role, b)) if !b.writable => Err(argument(format!(
            "{role} is read-only and this call writes it: pass a writable buffer (or out= for \
             the result)"
        ))),
        _ => Ok(()),
    }
}
