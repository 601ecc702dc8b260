//! How each collective of a job across hosts is composed of stages (the table and the list in
//! the parent module's doc): the stage list of one call, built on the layout.

use super::{Area, Hosts, Level, Span, Stage, Who};
use crate::plan::Collective;

/// The stage list being built, with the layout.
pub(super) struct Stages {
    pub(super) hosts: Hosts,
    pub(super) list: Vec<Stage>,
}

impl Stages {
    fn copy(&mut self, who: Who, src: Span, dst: Span) {
        if src.count > 0 {
            self.list.push(Stage::Copy { who, src, dst });
        }
    }

    /// A collective stage; left out where it has nothing to do (no elements, or a group of
    /// one rank, where every collective in place is the identity).
    fn collective(
        &mut self,
        level: Level,
        who: Who,
        collective: Collective,
        count: usize,
        span: Span,
    ) {
        let group = match level {
            Level::Intra => self.hosts.local,
            Level::Inter => self.hosts.hosts,
        };
        if count > 0 && group > 1 {
            self.list.push(Stage::Collective {
                level,
                who,
                collective,
                count,
                src: None,
                span,
            });
        }
    }

    fn scale(&mut self, average: bool, who: Who, span: Span) {
        if average && span.count > 0 {
            self.list.push(Stage::Scale { who, span });
        }
    }

    /// The `hosts × local` blocks of `count` elements moved between rank order (`(h·local + l)`)
    /// and local-major order (`(l·hosts + h)`): one copy per block, from `from` (an area and
    /// the element its blocks start at) into `to`.
    fn transpose(
        &mut self,
        count: usize,
        from: (Area, usize),
        to: (Area, usize),
        to_rank_order: bool,
    ) {
        let Hosts { hosts, local } = self.hosts;
        for h in 0..hosts {
            for l in 0..local {
                let (rank_order, local_major) = ((h * local + l) * count, (l * hosts + h) * count);
                let (src, dst) = match to_rank_order {
                    false => (rank_order, local_major),
                    true => (local_major, rank_order),
                };
                self.copy(
                    Who::All,
                    Span::fixed(from.0, from.1 + src, count),
                    Span::fixed(to.0, to.1 + dst, count),
                );
            }
        }
    }
}

/// The caller's buffer holding the input: the input out of place, the one buffer in place.
fn source(in_place: bool) -> Area {
    match in_place {
        true => Area::Output,
        false => Area::Input,
    }
}

pub(super) fn all_reduce(st: &mut Stages, count: usize, in_place: bool, average: bool) {
    let local = st.hosts.local;
    let (s, body) = (count / local, count / local * local);
    let tail = Span::fixed(Area::Output, body, count - body);
    let block = Span {
        per_local: s,
        ..Span::fixed(Area::Output, 0, s)
    };
    if !in_place {
        st.copy(
            Who::All,
            Span::fixed(Area::Input, 0, count),
            Span::fixed(Area::Output, 0, count),
        );
    }
    let whole = Span::fixed(Area::Output, 0, body);
    st.collective(Level::Intra, Who::All, Collective::ReduceScatter, s, whole);
    st.collective(
        Level::Intra,
        Who::All,
        Collective::AllReduce,
        tail.count,
        tail,
    );
    st.collective(Level::Inter, Who::All, Collective::AllReduce, s, block);
    st.collective(
        Level::Inter,
        Who::All,
        Collective::AllReduce,
        tail.count,
        tail,
    );
    st.scale(average, Who::All, block);
    st.scale(average, Who::All, tail);
    st.collective(Level::Intra, Who::All, Collective::AllGather, s, whole);
}

pub(super) fn reduce_scatter(st: &mut Stages, count: usize, in_place: bool, average: bool) {
    let Hosts { hosts, local } = st.hosts;
    st.transpose(count, (source(in_place), 0), (Area::Work, 0), false);
    let all = Span::fixed(Area::Work, 0, hosts * local * count);
    st.collective(
        Level::Intra,
        Who::All,
        Collective::ReduceScatter,
        hosts * count,
        all,
    );
    let group = Span {
        per_local: hosts * count,
        ..Span::fixed(Area::Work, 0, hosts * count)
    };
    st.collective(
        Level::Inter,
        Who::All,
        Collective::ReduceScatter,
        count,
        group,
    );
    let mine = Span {
        per_host: count,
        per_local: hosts * count,
        ..Span::fixed(Area::Work, 0, count)
    };
    st.scale(average, Who::All, mine);
    let out = match in_place {
        // Block g of the one buffer.
        true => Span {
            per_host: local * count,
            per_local: count,
            ..Span::fixed(Area::Output, 0, count)
        },
        false => Span::fixed(Area::Output, 0, count),
    };
    st.copy(Who::All, mine, out);
}

pub(super) fn all_gather(st: &mut Stages, count: usize, in_place: bool) {
    let Hosts { hosts, local } = st.hosts;
    let input = match in_place {
        true => Span {
            per_host: local * count,
            per_local: count,
            ..Span::fixed(Area::Output, 0, count)
        },
        false => Span::fixed(Area::Input, 0, count),
    };
    let mine = Span {
        per_host: count,
        per_local: hosts * count,
        ..Span::fixed(Area::Work, 0, count)
    };
    st.copy(Who::All, input, mine);
    let group = Span {
        per_local: hosts * count,
        ..Span::fixed(Area::Work, 0, hosts * count)
    };
    st.collective(Level::Inter, Who::All, Collective::AllGather, count, group);
    let all = Span::fixed(Area::Work, 0, hosts * local * count);
    st.collective(
        Level::Intra,
        Who::All,
        Collective::AllGather,
        hosts * count,
        all,
    );
    st.transpose(count, (Area::Work, 0), (Area::Output, 0), true);
}

pub(super) fn broadcast(st: &mut Stages, root: usize, count: usize, in_place: bool) {
    let hosts = st.hosts;
    let out = Span::fixed(Area::Output, 0, count);
    if !in_place {
        st.copy(Who::Rank(root), Span::fixed(Area::Input, 0, count), out);
    }
    let (h0, l0) = (hosts.host_of(root), hosts.local_of(root));
    let inter = Collective::Broadcast { root: h0 };
    st.collective(Level::Inter, Who::Local(l0), inter, count, out);
    let intra = Collective::Broadcast { root: l0 };
    st.collective(Level::Intra, Who::All, intra, count, out);
}

pub(super) fn reduce(st: &mut Stages, root: usize, count: usize, in_place: bool, average: bool) {
    let hosts = st.hosts;
    let work = Span::fixed(Area::Work, 0, count);
    st.copy(Who::All, Span::fixed(source(in_place), 0, count), work);
    let (h0, l0) = (hosts.host_of(root), hosts.local_of(root));
    st.collective(
        Level::Intra,
        Who::All,
        Collective::Reduce { root: l0 },
        count,
        work,
    );
    let inter = Collective::Reduce { root: h0 };
    st.collective(Level::Inter, Who::Local(l0), inter, count, work);
    st.scale(average, Who::Rank(root), work);
    st.copy(Who::Rank(root), work, Span::fixed(Area::Output, 0, count));
}

/// Work holds two buffers of `world·count`: the inter stage's result at 0, the intra stage's
/// input (its blocks transposed) after it, and the intra stage's result back at 0.
pub(super) fn all_to_all(st: &mut Stages, count: usize) {
    let Hosts { hosts, local } = st.hosts;
    let world = hosts * local;
    let second = world * count;
    // Inter: rank (h, l) sends every host h' the blocks bound for h' (L blocks, one per local
    // index) and gets, in block h', host h''s rank l's blocks bound for host h.
    let input = Span::fixed(Area::Input, 0, world * count);
    let first = Span::fixed(Area::Work, 0, world * count);
    let (src, into) = match hosts > 1 {
        true => {
            st.list.push(Stage::Collective {
                level: Level::Inter,
                who: Who::All,
                collective: Collective::AllToAll,
                count: local * count,
                src: Some(input),
                span: first,
            });
            (Area::Work, 0)
        }
        false => (Area::Input, 0),
    };
    // Work[h'·L·c + l'·c] is from (h', l) bound for (h, l'): gather by l'.
    st.transpose(count, (src, into), (Area::Work, second), false);
    // Intra: rank (h, l) sends local index l' its block l' (H blocks bound for (h, l')) and
    // gets in block l'' what (h, l'') gathered for it: from (h', l'') for every h'.
    let gathered = Span::fixed(Area::Work, second, world * count);
    let intra_out = Span::fixed(Area::Work, 0, world * count);
    let (result, base) = match local > 1 {
        true => {
            st.list.push(Stage::Collective {
                level: Level::Intra,
                who: Who::All,
                collective: Collective::AllToAll,
                count: hosts * count,
                src: Some(gathered),
                span: intra_out,
            });
            (Area::Work, 0)
        }
        false => (Area::Work, second),
    };
    // Work[l''·H·c + h'·c] is from (h', l''): into rank order.
    st.transpose(count, (result, base), (Area::Output, 0), true);
}
