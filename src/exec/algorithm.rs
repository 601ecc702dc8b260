//! Which algorithm runs a collective: [`Algorithm`], and the one selection ([`select`]) by which
//! a call's algorithm is decided from the communicator's choice, the collective, the message
//! size, placement, world size and how the ranks reach each other ([`Reach`]). Both executors,
//! `Communicator::algorithm_for(_collective)` and the CLI ask it and nothing else decides; its
//! rules by reach (the GPUs', the staged one, the host ranks', the other collectives') are the
//! private functions below. Every threshold is defined here once; the measurements that set
//! them are in docs/PERFORMANCE.md ("Choosing the algorithm"), and everything else links here
//! instead of restating the rule.
//!
//! One size rule lives with the GPU kernels instead, because it chooses a kernel, not an
//! algorithm: with [`crate::CudaConfig::low_latency`] on, a one-shot all-reduce of at most
//! [`LL_MAX_BYTES`](crate::exec::cuda::LL_MAX_BYTES) per rank runs the LL one-shot
//! kernel (pushed words, no barrier) rather than the read one-shot — the same plan and the same
//! bits ([`crate::exec::cuda::ll_fits`]).

/// Which all-reduce algorithm a communicator runs (module doc of [`crate::plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// On GPUs the one-shot up to a message size, the ring above it (the staged one-shot and
    /// the ring where edges are staged; across processes, the two-shot instead of the ring:
    /// [`Ask::gated`]); on host ranks the pushed two-shot ([`select`]).
    #[default]
    Auto,
    /// Always the ring: reduce-scatter then all-gather over copy engines (SMs stay free).
    Ring,
    /// Always the one-shot: every rank reads every rank's input directly, barriers around
    /// (at most 8 ranks on GPUs). Where GPUs do not all reach each other, or edges are forced
    /// `Staged`, its staged form: every rank's source through a host copy
    /// ([`crate::plan::staged`]).
    OneShot,
    /// Always the two-shot: each rank reduces its own segment from every rank's input, then
    /// gathers the other segments from their owners, reading peer memory directly, three
    /// barriers (the one-shot's needs; no copy of the buffer in place). Host ranks push
    /// instead: each owner writes its reduced segment into every rank's buffer as it reduces
    /// it, two barriers — their fastest all-reduce from a few KiB up (docs/PERFORMANCE.md,
    /// "Host executor"). See [`crate::plan::twoshot`].
    TwoShot,
}

impl Algorithm {
    /// Whether this is one of the algorithms that read peer memory from SM kernels (the
    /// one-shot and the two-shot), which need peer access between every pair of GPUs.
    pub fn reads_peers(self) -> bool {
        matches!(self, Algorithm::OneShot | Algorithm::TwoShot)
    }
}

/// The largest message (bytes per rank) for which [`Algorithm::Auto`] runs a peer-reading
/// algorithm (the one-shot or the two-shot) on two ranks; with more ranks the limit shrinks as
/// `2/n`, since each rank then reads `n − 1` inputs where the ring moves `2(n−1)/n` of one. Set
/// where the ring overtakes the peer-reading algorithms on 2×H200 (docs/PERFORMANCE.md,
/// "Choosing the algorithm").
pub const ONESHOT_AUTO_MAX_BYTES: usize = 32 << 20;

/// The smallest in-place message (bytes per rank) for which [`Algorithm::Auto`] runs the
/// two-shot rather than the one-shot on two ranks (scaled by `2/n` like the limit above): the
/// one-shot in place first copies its buffer for its peers to read, which the two-shot does not
/// need; out of place the one-shot is as fast or faster, so out of place stays one-shot (the
/// measurements: docs/PERFORMANCE.md, "Choosing the algorithm").
pub const TWOSHOT_AUTO_MIN_IN_PLACE_BYTES: usize = 8 << 20;

/// Deterministic results (`deterministic: true` in [`crate::CudaConfig`] and
/// [`crate::HostConfig`]): every element of a reducing collective is folded in rank order, 0, 1,
/// …, n − 1, whatever the algorithm, message size or placement, so the bits a caller gets do not
/// depend on the size at which `Auto` switches (batch invariance). The all-reduce is described
/// here; the reduce-scatter and the reduce keep their one-shot form at every size instead
/// ([`select`]). The one-shot and the two-shot fold in rank order
/// already; the ring folds segment s starting at rank s + 1, which for n ≤ 2 gives the same
/// bits (a fold of two operands is `a ⊕ b = b ⊕ a`, exactly, for every operator and type) and
/// for n > 2 does not. So in deterministic mode with more than two ranks `Auto` never picks the
/// ring (the two-shot takes the sizes above the one-shot's limit), and a ring forced there, or
/// ranks without peer access between every pair, are refused when the communicator is made.
/// Cost: none at n ≤ 2 (nothing changes); at n > 2 the two-shot instead of the ring above the
/// one-shot's limit, a little slower than the ring there (docs/PERFORMANCE.md, "Choosing the
/// algorithm"); with more ranks it is not measured.
pub fn deterministic_needs_peers(world: usize) -> bool {
    world > 2
}

/// The largest all-reduce (bytes per rank, on two ranks; scaled by `2/n` as the one-shot's
/// limit) for which [`Algorithm::Auto`] runs the staged one-shot ([`crate::plan::staged`]) where
/// edges are staged; the ring above it. Provisional: each rank reads every rank's copy from host
/// memory (n·count elements over the host link) against the ring's two copies of 2(n−1)/n·count
/// per step, so the one-shot wins while the ring's fixed cost dominates (on 2×H200 the staged
/// ring took ~50–116 µs a call below 1 MiB, docs/guide/09-trade-offs.md); the crossover is to
/// be measured in the two-GPU run.
pub const STAGED_ONESHOT_AUTO_MAX_BYTES: usize = 256 << 10;

impl Algorithm {
    /// The all-reduce algorithm where edges are staged (no peer access): `Auto` takes the
    /// staged one-shot up to [`STAGED_ONESHOT_AUTO_MAX_BYTES`] (scaled by `2/n`) and the ring
    /// above — the staged one-shot at every size where `deterministic` needs rank-order folds
    /// that the ring does not give ([`deterministic_needs_peers`]), or where the call gate
    /// checks the calls (`gated`: a copy-engine plan would meet the peers' hosts); `OneShot` is
    /// the staged one-shot at every size; the rest are themselves (the caller refuses what
    /// cannot run staged).
    fn choose_staged(
        self,
        bytes: usize,
        world: usize,
        deterministic: bool,
        gated: bool,
    ) -> Algorithm {
        match self {
            Algorithm::Auto if world > 1 => {
                let limit = STAGED_ONESHOT_AUTO_MAX_BYTES.saturating_mul(2) / world;
                let ordered = deterministic && deterministic_needs_peers(world);
                if bytes <= limit || ordered || gated {
                    Algorithm::OneShot
                } else {
                    Algorithm::Ring
                }
            }
            Algorithm::Auto => Algorithm::Ring,
            other => other,
        }
    }
}

impl Algorithm {
    /// The algorithm that runs a message of `bytes` per rank over `world` ranks, in place or
    /// not; `peers_ok` says whether the peer-reading algorithms can run at all (every pair of
    /// GPUs reaches each other); `deterministic` asks for rank-order folds (see
    /// [`deterministic_needs_peers`]).
    fn choose(
        self,
        bytes: usize,
        world: usize,
        in_place: bool,
        peers_ok: bool,
        deterministic: bool,
        gated: bool,
    ) -> Algorithm {
        match self {
            Algorithm::Auto if world > 1 && peers_ok => {
                let scaled = |limit: usize| limit.saturating_mul(2) / world;
                if bytes > scaled(ONESHOT_AUTO_MAX_BYTES) {
                    if gated || deterministic && deterministic_needs_peers(world) {
                        Algorithm::TwoShot
                    } else {
                        Algorithm::Ring
                    }
                } else if in_place && bytes >= scaled(TWOSHOT_AUTO_MIN_IN_PLACE_BYTES) {
                    Algorithm::TwoShot
                } else {
                    Algorithm::OneShot
                }
            }
            Algorithm::Auto => Algorithm::Ring,
            other => other,
        }
    }
}

impl Algorithm {
    /// The all-reduce algorithm on host ranks whose edges are not staged: `Auto` runs the
    /// two-shot (its gather pushed, [`crate::plan::twoshot`]) at every size from 2 to
    /// [`twoshot::MAX_RANKS`](crate::plan::twoshot::MAX_RANKS) ranks — the fastest of the three
    /// on host ranks in nearly every measurement from 4 B to 64 MiB at 2, 4 and 8 ranks, and the
    /// only one that moves no more memory than a hand-written loop (docs/PERFORMANCE.md, "Host
    /// executor"); it folds in rank order, as `deterministic` asks. On more ranks the ring, or
    /// the one-shot where `deterministic` needs rank-order folds ([`deterministic_needs_peers`]).
    /// The GPU's size rule ([`Algorithm::choose`]) does not apply: its thresholds weigh copy
    /// engines against SM kernels, which host ranks do not have. The rest are themselves.
    fn choose_host(self, world: usize, deterministic: bool) -> Algorithm {
        match self {
            Algorithm::Auto if (2..=crate::plan::twoshot::MAX_RANKS).contains(&world) => {
                Algorithm::TwoShot
            }
            Algorithm::Auto if deterministic && deterministic_needs_peers(world) => {
                Algorithm::OneShot
            }
            Algorithm::Auto => Algorithm::Ring,
            other => other,
        }
    }
}

/// The most bytes that cross one rank's links in a one-shot collective other than the
/// all-reduce for which [`Algorithm::Auto`] runs the one-shot (the ring above it): `(n − 1)` ×
/// the collective's count in bytes, which each rank reads (reduce-scatter, all-gather,
/// all-to-all, the reduce's root) or serves (the broadcast's root). Provisional, not yet
/// measured per collective: set where the all-reduce's measurements make the one-shot the clear
/// winner (docs/PERFORMANCE.md, "Choosing the algorithm") — a copy-engine plan pays ~20 µs of
/// chained copies and cross-GPU events before its bytes count, and the ring's collectives move
/// no more bytes than the one-shot's.
pub const COLLECTIVE_ONESHOT_AUTO_MAX_BYTES: usize = 4 << 20;

impl Algorithm {
    /// The algorithm that runs the call `ask` describes, on ranks whose peer-reading kernels can
    /// run where `peers_ok`, whose calls the call gate checks where `gated` ([`Ask::gated`]). The
    /// all-reduce follows [`Algorithm::choose`]. The others have two forms: the ring's (copy engines,
    /// [`crate::plan::CollectiveSpec`]) and the one-shot's (SM kernels reading peer memory,
    /// [`crate::plan::OneShotSpec::build_collective`]); the two-shot is an all-reduce only, so
    /// forcing it (or the one-shot) runs the one-shot form. Send/recv runs the ring's form, or
    /// where `gated` under `Auto` its one-shot form where the kernel runs it ([`sendrecv_kernel_fits`]).
    /// `Auto` takes the one-shot up to [`COLLECTIVE_ONESHOT_AUTO_MAX_BYTES`] crossing a rank's
    /// links, or at every size where `gated`; in deterministic mode with more than two ranks the
    /// reducing collectives always take the one-shot (it folds in rank order; the ring's
    /// reduce-scatter and reduce chain do not).
    fn choose_for(self, ask: &Ask<'_>, peers_ok: bool, gated: bool) -> Algorithm {
        use crate::plan::Collective;
        let (collective, world) = (ask.collective, ask.world);
        match collective {
            Collective::AllReduce => {
                let (bytes, det) = (ask.count_bytes, ask.deterministic);
                return self.choose(bytes, world, ask.in_place, peers_ok, det, gated);
            }
            Collective::SendRecv { transfers } => {
                let pulled = self == Algorithm::Auto && peers_ok && gated;
                return match pulled && sendrecv_kernel_fits(transfers, world) {
                    true => Algorithm::OneShot,
                    false => Algorithm::Ring,
                };
            }
            _ => {}
        }
        match self {
            Algorithm::Ring => Algorithm::Ring,
            // (Where ranks do not read each other, a forced one-shot is the all-reduce's staged
            // one: another collective's one-shot form would read its peers' GPUs.)
            Algorithm::OneShot | Algorithm::TwoShot if peers_ok => Algorithm::OneShot,
            Algorithm::OneShot | Algorithm::TwoShot => Algorithm::Ring,
            Algorithm::Auto if world > 1 && peers_ok => {
                let crossing = ask.count_bytes.saturating_mul(world - 1);
                let ordered =
                    ask.deterministic && deterministic_needs_peers(world) && collective.reduces();
                if ordered || gated || crossing <= COLLECTIVE_ONESHOT_AUTO_MAX_BYTES {
                    Algorithm::OneShot
                } else {
                    Algorithm::Ring
                }
            }
            Algorithm::Auto => Algorithm::Ring,
        }
    }
}

/// Whether a send/recv of `transfers` over `world` ranks runs as the steps kernel: the list has
/// a one-shot form ([`crate::plan::sendrecv::oneshot_count`]; empty transfers alone too, which
/// meet and move nothing), and no rank receives more transfers than the kernel runs steps.
fn sendrecv_kernel_fits(transfers: &[crate::plan::Transfer], world: usize) -> bool {
    use crate::exec::cuda::kernels::PEER_MAX_RANKS;
    let receives = |r: usize| transfers.iter().filter(|t| t.to == r).count();
    crate::plan::sendrecv::oneshot_count(transfers).is_some()
        && (0..world).all(|r| receives(r) <= PEER_MAX_RANKS)
}

/// How a communicator's ranks reach each other's memory, as [`select`] weighs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// GPUs of which every pair reads the other's memory: the peer kernels run.
    Peers,
    /// 2 to 8 GPUs that do not all reach each other: the all-reduce takes the staged
    /// algorithms ([`crate::plan::staged`]: every exchange through pinned host memory), the other
    /// collectives the ring.
    Staged,
    /// GPUs that do not all reach each other, one of them or more than 8: the ring.
    Apart,
    /// Host ranks: every rank reads every rank's memory, without SM kernels to weigh against
    /// copy engines.
    Host,
    /// Host ranks over edges forced `Staged`: the all-reduce takes the staged algorithms.
    HostStaged,
}

/// How a selected algorithm runs: the form its plan takes on the executor. Decided with the
/// algorithm by [`select`]; what a call actually ran says it again ([`Ran`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Copies on the GPUs' copy engines, reduce kernels between them, ordered by events: the
    /// ring's all-reduce, every other collective's ring form, send/recv, and any call of one
    /// rank.
    CopyEngines,
    /// The read one-shot kernel: one kernel per rank reads every rank's input, barriers around.
    OneShotKernel,
    /// The LL one-shot kernel: each rank pushes its input into its peers' receive buffers as
    /// flagged words, no barrier ([`crate::CudaConfig::low_latency`], up to
    /// [`LL_MAX_BYTES`](crate::exec::cuda::LL_MAX_BYTES) per rank) — the read one-shot's plan
    /// and bits.
    LlKernel,
    /// The read one-shot kernel over every rank's host copy ([`crate::plan::staged`]), for GPUs
    /// that do not all reach each other.
    StagedKernel,
    /// The two-shot kernel: each rank reduces its segment, then gathers the others'.
    TwoShotKernel,
    /// The one-shot form of a collective other than the all-reduce: each rank's steps in one
    /// kernel between a start and an end barrier.
    StepsKernel,
    /// The point-to-point channel: a rank's group of sends and receives in one kernel, pushed
    /// through its peers' mailboxes and matched per direction on the GPUs (no plan; one process
    /// per GPU).
    Channel,
    /// Host ranks: the plan's operations on host threads (every algorithm).
    HostThreads,
}

impl Form {
    /// Whether this form runs as a peer kernel on GPUs — the forms the call gate checks (the
    /// copy engines' and host threads' do not).
    pub fn is_peer_kernel(self) -> bool {
        !matches!(self, Form::CopyEngines | Form::HostThreads | Form::Channel)
    }
}

/// What [`select`] decides for a call: the algorithm and the form it runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selection {
    /// Never `Auto`: the algorithm that runs (for a collective other than the all-reduce, `Ring`
    /// or `OneShot`: which of its two forms).
    pub algorithm: Algorithm,
    /// The form it runs in.
    pub form: Form,
}

/// What [`select`] decides from: the call and the communicator.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    /// The communicator's [`Algorithm`]: `Auto`, or one forced.
    pub chosen: Algorithm,
    /// The call's collective.
    pub collective: &'a crate::plan::Collective,
    /// The collective's count times the element size (the all-reduce's bytes per rank).
    pub count_bytes: usize,
    /// The number of ranks.
    pub world: usize,
    /// The call's placement.
    pub in_place: bool,
    /// How the ranks reach each other.
    pub reach: Reach,
    /// Whether rank-order folds are asked for ([`deterministic_needs_peers`]).
    pub deterministic: bool,
    /// With the LL one-shot's receive buffers ([`crate::CudaConfig::low_latency`]): the peer
    /// kernels' grid cap, which the LL kernel's grid must fit (every block of every rank
    /// resident at once); `None` without them.
    pub ll_grid: Option<u32>,
    /// Whether the ranks' calls are checked on their GPUs by the call gate (ranks in several
    /// processes whose GPUs reach every rank's control words: `Fabric::gate`). Only a kernel
    /// obeys the gate — copies would run whatever it found — so a call of the copy engines'
    /// form meets the peers' hosts instead. Where every pair of GPUs reaches the other,
    /// `Auto` then takes a kernel form at every size: the all-reduce the two-shot above the
    /// one-shot's limit (~10 % slower than the ring at 64–128 MiB on 2×H200, in one process:
    /// docs/PERFORMANCE.md, "Choosing the algorithm"), the other collectives their one-shot
    /// form, and a send/recv that moves something its one-shot form (each receiver pulls), a
    /// rank party to no transfer joining its barriers alone (one with more receives a rank than
    /// the kernel runs, or sends larger than the arenas, in pieces: `cuda::executor`'s module
    /// `pieces`). Over staged reach it also says that every rank's arena is pinned host
    /// memory (`cuda::executor`'s module `peer_words`): every collective then takes its
    /// one-shot form at every size — the all-reduce its staged one-shot, the others the steps
    /// kernel, whose peers' buffers all lie in the host arenas — and a call that cannot be
    /// prepared there is selected ungated (the ring, which meets).
    pub gated: bool,
}

/// What a call runs — the one selection: its algorithm, and the form that algorithm takes.
///
/// The algorithm. The all-reduce: on GPUs of one reach the one-shot up to
/// [`ONESHOT_AUTO_MAX_BYTES`] (scaled by `2/n`), the two-shot in place from
/// [`TWOSHOT_AUTO_MIN_IN_PLACE_BYTES`], the ring above; over staged edges the staged one-shot up
/// to [`STAGED_ONESHOT_AUTO_MAX_BYTES`], the ring above; on host ranks the pushed two-shot. The
/// other collectives: the one-shot form up to [`COLLECTIVE_ONESHOT_AUTO_MAX_BYTES`] crossing a
/// rank's links where ranks read each other, the ring's form otherwise; send/recv the ring's.
/// Where the call gate checks the calls ([`Ask::gated`]: ranks in several processes) and
/// every pair of GPUs reaches the other, `Auto` keeps a kernel form at every size: the two-shot
/// instead of the ring above the one-shot's limit, the other collectives' one-shot form instead
/// of their ring's, a send/recv its one-shot form where the kernel runs it — so that no call of theirs
/// meets the peers' hosts; over staged reach, gated, every collective keeps its one-shot form
/// at every size on the host arenas (the all-reduce its staged one-shot). A forced algorithm is
/// itself (the one-shot or two-shot of another collective is its one-shot form), refused at
/// creation where it cannot run; a forced one-shot on GPUs that do not all reach each other is
/// the all-reduce's staged one-shot, and the other collectives keep the ring (their one-shot
/// form where gated).
///
/// The form ([`Form`]): on host ranks their threads; on GPUs the ring's is the copy engines,
/// the two-shot's its kernel, another collective's one-shot its steps kernel, and the
/// all-reduce's one-shot the staged kernel over staged reach, else the LL kernel where the
/// communicator has its buffers (`ll_grid`) and the message fits it (at most
/// [`LL_MAX_BYTES`](crate::exec::cuda::LL_MAX_BYTES) per rank, its grid within `ll_grid`), else
/// the read one-shot kernel. A call of one rank copies only.
///
/// Every input is the same on every rank of a call, so every rank selects alike.
pub fn select(ask: &Ask<'_>) -> Selection {
    use crate::plan::Collective;
    let (bytes, world, det, gated) = (ask.count_bytes, ask.world, ask.deterministic, ask.gated);
    let chosen = ask.chosen;
    let algorithm = match (ask.collective, ask.reach) {
        (Collective::AllReduce, Reach::Staged) => chosen.choose_staged(bytes, world, det, gated),
        (Collective::AllReduce, Reach::HostStaged) => {
            chosen.choose_staged(bytes, world, det, false)
        }
        (Collective::AllReduce, Reach::Host) => chosen.choose_host(world, det),
        (Collective::AllReduce, Reach::Peers) => {
            chosen.choose(bytes, world, ask.in_place, true, det, gated)
        }
        (Collective::AllReduce, Reach::Apart) => {
            chosen.choose(bytes, world, ask.in_place, false, det, false)
        }
        (_, Reach::Peers) => chosen.choose_for(ask, true, gated),
        (_, Reach::Host | Reach::HostStaged) => chosen.choose_for(ask, true, false),
        // Gated over staged reach, the one-shot forms run on the host arenas: their peers'
        // buffers are all host memory (`Ask::gated`).
        (_, Reach::Staged) if gated => chosen.choose_for(ask, true, true),
        (_, Reach::Staged | Reach::Apart) => chosen.choose_for(ask, false, false),
    };
    let all_reduce = *ask.collective == Collective::AllReduce;
    let form = match (algorithm, ask.reach) {
        (_, Reach::Host | Reach::HostStaged) => Form::HostThreads,
        _ if world < 2 => Form::CopyEngines,
        (Algorithm::Ring | Algorithm::Auto, _) => Form::CopyEngines,
        (_, _) if !all_reduce => Form::StepsKernel,
        (Algorithm::TwoShot, _) => Form::TwoShotKernel,
        (Algorithm::OneShot, Reach::Staged) => Form::StagedKernel,
        (Algorithm::OneShot, _) => match ask.ll_grid {
            Some(grid) if ll_fits_grid(bytes, grid) => Form::LlKernel,
            _ => Form::OneShotKernel,
        },
    };
    Selection { algorithm, form }
}

/// Whether an all-reduce of `bytes` per rank fits the LL one-shot kernel on a grid cap of
/// `grid` blocks: at most [`LL_MAX_BYTES`](crate::exec::cuda::LL_MAX_BYTES), its grid
/// ([`ll_blocks`](crate::exec::cuda::kernels::ll_blocks)) within the cap.
fn ll_fits_grid(bytes: usize, grid: u32) -> bool {
    use crate::exec::cuda::kernels::{ll_blocks, LL_MAX_BYTES};
    bytes <= LL_MAX_BYTES && ll_blocks(bytes) <= grid
}

/// What a call ran, as the executor that ran it says (not predicted): the algorithm and form
/// of the plan it ran ([`Selection`]), how the ranks reached each other, and how the call met
/// the caller's buffers and streams. [`crate::Communicator::last_ran`] and
/// [`crate::RankCommunicator::last_ran`] give the latest call's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ran {
    /// The algorithm of the plan it ran (never `Auto`).
    pub algorithm: Algorithm,
    /// The form the plan ran in, as the executor ran it.
    pub form: Form,
    /// How the ranks reached each other's memory.
    pub reach: Reach,
    /// The caller's output was also its input.
    pub in_place: bool,
    /// Some of the caller's buffers — those a peer reads or writes — were copied into the
    /// library's own before any peer touched them (and out after): peers in other processes
    /// reach only memory the library exported, or registered.
    pub copied: bool,
    /// The call ran on the ranks' registered buffers, peers' included, without copies.
    pub registered: bool,
    /// The call was captured into the caller's CUDA graph rather than run eagerly.
    pub captured: bool,
    /// The calls it ran as: 1, or the pieces of a call too large for the arenas across
    /// processes, each a call of this form.
    pub pieces: usize,
}

/// Whether a communicator of `world` ranks with `algorithm` can keep the deterministic promise:
/// an error naming why not, for [`crate::Communicator`]'s constructors.
pub(crate) fn check_deterministic(
    algorithm: Algorithm,
    world: usize,
    peers_ok: bool,
) -> crate::error::Result<()> {
    if !deterministic_needs_peers(world) {
        return Ok(());
    }
    if algorithm == Algorithm::Ring {
        return Err(crate::error::Error::InvalidArgument(format!(
            "deterministic mode with {world} ranks cannot run the ring (it folds each segment from a different rank); use Auto, OneShot or TwoShot"
        )));
    }
    if !peers_ok {
        return Err(crate::error::Error::InvalidArgument(format!(
            "deterministic mode with {world} ranks needs peer access between every pair of GPUs (the one- and two-shot); these GPUs lack it"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Collective;

    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;

    /// What `chosen` is asked for a call of `collective`: out of place, no deterministic
    /// folds, no LL buffers (the tests change a field with `..`).
    fn asked(
        chosen: Algorithm,
        collective: &Collective,
        bytes: usize,
        world: usize,
        reach: Reach,
    ) -> Ask<'_> {
        Ask {
            chosen,
            collective,
            count_bytes: bytes,
            world,
            in_place: false,
            reach,
            deterministic: false,
            ll_grid: None,
            gated: false,
        }
    }

    /// The selection for `chosen`, in place or not, as [`asked`] otherwise.
    fn ask(
        chosen: Algorithm,
        collective: &Collective,
        bytes: usize,
        world: usize,
        in_place: bool,
        reach: Reach,
    ) -> Selection {
        select(&Ask {
            in_place,
            ..asked(chosen, collective, bytes, world, reach)
        })
    }

    fn auto(
        collective: &Collective,
        bytes: usize,
        world: usize,
        in_place: bool,
        r: Reach,
    ) -> Algorithm {
        ask(Algorithm::Auto, collective, bytes, world, in_place, r).algorithm
    }

    #[test]
    fn the_all_reduce_follows_each_reach_rule() {
        let ar = Collective::AllReduce;
        // GPUs that reach each other: the one-shot, the two-shot in place from its limit, the
        // ring above the one-shot's limit (both scaled by 2/n).
        assert_eq!(auto(&ar, KIB, 2, false, Reach::Peers), Algorithm::OneShot);
        assert_eq!(
            auto(&ar, 16 * MIB, 2, true, Reach::Peers),
            Algorithm::TwoShot
        );
        assert_eq!(
            auto(&ar, 16 * MIB, 2, false, Reach::Peers),
            Algorithm::OneShot
        );
        assert_eq!(auto(&ar, 64 * MIB, 2, false, Reach::Peers), Algorithm::Ring);
        assert_eq!(auto(&ar, 20 * MIB, 4, false, Reach::Peers), Algorithm::Ring);
        // Staged, GPUs or host ranks: the staged one-shot for small messages, the ring above.
        for staged in [Reach::Staged, Reach::HostStaged] {
            assert_eq!(auto(&ar, 64 * KIB, 2, false, staged), Algorithm::OneShot);
            assert_eq!(auto(&ar, MIB, 2, false, staged), Algorithm::Ring);
        }
        // GPUs apart without the staged one-shot: the ring at every size.
        assert_eq!(auto(&ar, 4, 9, false, Reach::Apart), Algorithm::Ring);
        // Host ranks: the pushed two-shot at every size, the ring above its rank limit.
        for bytes in [4, MIB, 1 << 30] {
            assert_eq!(auto(&ar, bytes, 4, true, Reach::Host), Algorithm::TwoShot);
        }
        let beyond = crate::plan::twoshot::MAX_RANKS + 1;
        assert_eq!(auto(&ar, 4, beyond, true, Reach::Host), Algorithm::Ring);
    }

    #[test]
    fn the_other_collectives_take_their_one_shot_form_where_ranks_read_each_other() {
        let rs = Collective::ReduceScatter;
        for reach in [Reach::Peers, Reach::Host, Reach::HostStaged] {
            assert_eq!(
                auto(&rs, KIB, 4, false, reach),
                Algorithm::OneShot,
                "{reach:?}"
            );
            // Above 4 MiB crossing a rank's links: the ring's form.
            assert_eq!(
                auto(&rs, 2 * MIB, 4, false, reach),
                Algorithm::Ring,
                "{reach:?}"
            );
        }
        for reach in [Reach::Staged, Reach::Apart] {
            assert_eq!(
                auto(&rs, KIB, 4, false, reach),
                Algorithm::Ring,
                "{reach:?}"
            );
        }
        let sendrecv = Collective::SendRecv {
            transfers: Vec::new(),
        };
        assert_eq!(
            auto(&sendrecv, KIB, 2, false, Reach::Peers),
            Algorithm::Ring
        );
        // Forced: itself; the two-shot of another collective is its one-shot form.
        let forced = |a| ask(a, &Collective::AllGather, KIB, 2, false, Reach::Peers).algorithm;
        assert_eq!(forced(Algorithm::Ring), Algorithm::Ring);
        assert_eq!(forced(Algorithm::TwoShot), Algorithm::OneShot);
        // A forced one-shot on GPUs that do not all reach each other runs the all-reduce's
        // staged one-shot; the other collectives keep the ring, whose copies go through host
        // memory (their one-shot form would read the peers' GPUs).
        let ag = Collective::AllGather;
        let staged = |c: &Collective| ask(Algorithm::OneShot, c, KIB, 2, false, Reach::Staged);
        let sel = |algorithm, form| Selection { algorithm, form };
        assert_eq!(staged(&ag), sel(Algorithm::Ring, Form::CopyEngines));
        assert_eq!(staged(&sendrecv), sel(Algorithm::Ring, Form::CopyEngines));
        let ar = staged(&Collective::AllReduce);
        assert_eq!(ar, sel(Algorithm::OneShot, Form::StagedKernel));
    }

    #[test]
    fn deterministic_mode_keeps_rank_order_folds_above_two_ranks() {
        let det = |collective: &Collective, bytes, reach| {
            let ask = Ask {
                deterministic: true,
                ..asked(Algorithm::Auto, collective, bytes, 3, reach)
            };
            select(&ask).algorithm
        };
        assert_eq!(
            det(&Collective::AllReduce, 64 * MIB, Reach::Peers),
            Algorithm::TwoShot
        );
        assert_eq!(
            det(&Collective::AllReduce, 64 * MIB, Reach::Staged),
            Algorithm::OneShot
        );
        assert_eq!(
            det(&Collective::ReduceScatter, 64 * MIB, Reach::Peers),
            Algorithm::OneShot
        );
        assert_eq!(
            det(&Collective::AllGather, 64 * MIB, Reach::Peers),
            Algorithm::Ring
        );
    }

    #[test]
    fn gated_calls_keep_a_kernel_form_at_every_size_where_gpus_reach_each_other() {
        let ar = Collective::AllReduce;
        let gated = |collective, bytes, world, in_place, reach, chosen| {
            select(&Ask {
                in_place,
                gated: true,
                ..asked(chosen, collective, bytes, world, reach)
            })
        };
        let auto = Algorithm::Auto;
        let sel = |algorithm, form| Selection { algorithm, form };
        // Above the one-shot's limit the two-shot, in place or not, where the ring ran.
        for world in [2, 3, 8] {
            for in_place in [false, true] {
                let big = 256 * MIB;
                assert_eq!(
                    ask(auto, &ar, big, world, in_place, Reach::Peers).form,
                    Form::CopyEngines
                );
                assert_eq!(
                    gated(&ar, big, world, in_place, Reach::Peers, auto),
                    sel(Algorithm::TwoShot, Form::TwoShotKernel),
                    "{world} ranks, in place {in_place}"
                );
            }
        }
        // Below it, what an ungated call selects.
        for bytes in [KIB, MIB, 8 * MIB] {
            for in_place in [false, true] {
                assert_eq!(
                    gated(&ar, bytes, 2, in_place, Reach::Peers, auto),
                    ask(auto, &ar, bytes, 2, in_place, Reach::Peers)
                );
            }
        }
        // Every other collective its one-shot form (the steps kernel) at any size.
        let root = Collective::Broadcast { root: 1 };
        let others = [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
            root,
            Collective::Reduce { root: 0 },
        ];
        for c in &others {
            assert_eq!(
                ask(auto, c, 64 * MIB, 3, false, Reach::Peers).form,
                Form::CopyEngines,
                "{c:?}"
            );
            assert_eq!(
                gated(c, 64 * MIB, 3, false, Reach::Peers, auto),
                sel(Algorithm::OneShot, Form::StepsKernel),
                "{c:?}"
            );
        }
        // A send/recv pulled by its receivers wherever the list names a transfer (a pipeline's
        // pair, an exchange, of any counts, empty transfers alone — NCCL's 0-byte
        // synchronisation — ranks party to no transfer among them), else the copy engines; a
        // forced ring stays the ring; GPUs that do not all reach each other keep their rules.
        let p2p = |transfers: &[(usize, usize, usize)]| Collective::SendRecv {
            transfers: transfers
                .iter()
                .map(|&(from, to, count)| crate::plan::Transfer { from, to, count })
                .collect(),
        };
        let pulled = [
            (p2p(&[(0, 1, 1 << 20)]), 2, true),
            (p2p(&[(0, 1, 64), (1, 0, 64)]), 2, true),
            (p2p(&[(0, 1, 64), (1, 2, 64), (2, 0, 64)]), 3, true),
            (p2p(&[(0, 1, 64), (1, 0, 65)]), 2, true),
            (p2p(&[(0, 1, 0), (1, 0, 65), (2, 0, 3), (0, 2, 1)]), 3, true),
            (p2p(&[(0, 1, 64)]), 3, true),
            (p2p(&[(1, 2, 64), (2, 1, 64)]), 4, true),
            (p2p(&[(0, 1, 0)]), 2, true),
            (p2p(&[(0, 1, 0), (1, 0, 0)]), 3, true),
            (p2p(&[]), 2, false),
        ];
        for (c, world, kernel) in &pulled {
            let want = match kernel {
                true => sel(Algorithm::OneShot, Form::StepsKernel),
                false => sel(Algorithm::Ring, Form::CopyEngines),
            };
            assert_eq!(
                gated(c, MIB, *world, false, Reach::Peers, auto),
                want,
                "{c:?}"
            );
            assert_eq!(
                ask(auto, c, MIB, *world, false, Reach::Peers),
                sel(Algorithm::Ring, Form::CopyEngines)
            );
        }
        let nine: Vec<_> = (1..10).map(|from| (from, 0, 8)).collect();
        let mut fan_in = p2p(&nine);
        if let Collective::SendRecv { transfers } = &mut fan_in {
            transfers.push(crate::plan::Transfer {
                from: 0,
                to: 1,
                count: 8,
            });
        }
        assert_eq!(
            gated(&fan_in, MIB, 10, false, Reach::Peers, auto).form,
            Form::CopyEngines,
            "more receives than the steps kernel runs"
        );
        assert_eq!(
            gated(&ar, 256 * MIB, 2, false, Reach::Peers, Algorithm::Ring),
            sel(Algorithm::Ring, Form::CopyEngines)
        );
        for c in [&ar, &Collective::AllGather] {
            assert_eq!(
                gated(c, 256 * MIB, 2, false, Reach::Apart, auto),
                ask(auto, c, 256 * MIB, 2, false, Reach::Apart),
                "{c:?}"
            );
        }
    }

    #[test]
    fn gated_calls_over_staged_reach_keep_their_one_shot_form_at_every_size() {
        let gated = |collective, bytes, world, chosen| {
            select(&Ask {
                gated: true,
                ..asked(chosen, collective, bytes, world, Reach::Staged)
            })
        };
        let (auto, ring) = (Algorithm::Auto, Algorithm::Ring);
        let sel = |algorithm, form| Selection { algorithm, form };
        let ar = Collective::AllReduce;
        for world in [2, 3, 8] {
            for bytes in [KIB, MIB, 256 * MIB] {
                assert_eq!(
                    gated(&ar, bytes, world, auto),
                    sel(Algorithm::OneShot, Form::StagedKernel),
                    "{world} ranks, {bytes} B"
                );
            }
            // Ungated, the ring above the staged one-shot's limit.
            assert_eq!(
                ask(auto, &ar, MIB, world, false, Reach::Staged).form,
                Form::CopyEngines
            );
        }
        let pair = Collective::SendRecv {
            transfers: vec![crate::plan::Transfer {
                from: 2,
                to: 0,
                count: 64,
            }],
        };
        let others = [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllToAll,
            Collective::Broadcast { root: 1 },
            Collective::Reduce { root: 0 },
            pair,
        ];
        for c in &others {
            assert_eq!(
                gated(c, 64 * MIB, 3, auto),
                sel(Algorithm::OneShot, Form::StepsKernel),
                "{c:?}"
            );
            // (A send/recv runs its one-shot form under `Auto` only, as where GPUs reach.)
            let forced = match c {
                Collective::SendRecv { .. } => Form::CopyEngines,
                _ => Form::StepsKernel,
            };
            assert_eq!(
                gated(c, 64 * MIB, 3, Algorithm::OneShot).form,
                forced,
                "{c:?}"
            );
            assert_eq!(
                ask(auto, c, 64 * MIB, 3, false, Reach::Staged),
                sel(ring, Form::CopyEngines),
                "{c:?}"
            );
            // A forced ring stays the ring.
            assert_eq!(
                gated(c, KIB, 3, ring),
                sel(ring, Form::CopyEngines),
                "{c:?}"
            );
        }
    }

    #[test]
    fn the_form_follows_the_algorithm_the_reach_and_the_ll_buffers() {
        let ar = Collective::AllReduce;
        let form = |chosen, collective: &Collective, bytes, world, reach, ll_grid| {
            let ask = Ask {
                ll_grid,
                ..asked(chosen, collective, bytes, world, reach)
            };
            select(&ask).form
        };
        let auto = Algorithm::Auto;
        // The one-shot all-reduce: LL where the buffers are and the message fits them (its
        // grid too), the read kernel otherwise; over staged reach the staged kernel.
        let ll = crate::exec::cuda::LL_MAX_BYTES;
        assert_eq!(
            form(auto, &ar, KIB, 2, Reach::Peers, Some(132)),
            Form::LlKernel
        );
        assert_eq!(
            form(auto, &ar, ll, 2, Reach::Peers, Some(132)),
            Form::LlKernel
        );
        assert_eq!(
            form(auto, &ar, ll + 4, 2, Reach::Peers, Some(132)),
            Form::OneShotKernel
        );
        assert_eq!(
            form(auto, &ar, KIB, 2, Reach::Peers, None),
            Form::OneShotKernel
        );
        let blocks = crate::exec::cuda::kernels::ll_blocks(ll);
        assert_eq!(
            form(auto, &ar, ll, 2, Reach::Peers, Some(blocks - 1)),
            Form::OneShotKernel
        );
        assert_eq!(
            form(auto, &ar, KIB, 2, Reach::Staged, Some(132)),
            Form::StagedKernel
        );
        // The ring, the two-shot, the other collectives' forms, host ranks, one rank.
        assert_eq!(
            form(auto, &ar, 1 << 30, 2, Reach::Peers, None),
            Form::CopyEngines
        );
        assert_eq!(
            form(Algorithm::TwoShot, &ar, KIB, 2, Reach::Peers, None),
            Form::TwoShotKernel
        );
        let ag = Collective::AllGather;
        assert_eq!(
            form(auto, &ag, KIB, 2, Reach::Peers, Some(132)),
            Form::StepsKernel
        );
        assert_eq!(
            form(auto, &ag, KIB, 2, Reach::Apart, None),
            Form::CopyEngines
        );
        for reach in [Reach::Host, Reach::HostStaged] {
            assert_eq!(form(auto, &ar, KIB, 2, reach, None), Form::HostThreads);
        }
        assert_eq!(
            form(Algorithm::OneShot, &ar, KIB, 1, Reach::Peers, Some(132)),
            Form::CopyEngines
        );
    }
}
