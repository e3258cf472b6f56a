//! Edge cases of the batched step on the CPU backend, through the public
//! API only: each must be a typed error or the same bits as the same work
//! done one sequence at a time.

use infer_compute::conformance::model::{random_model, Arch};
use infer_compute::cpu::{CpuBackend, Kernels, Precision};
use infer_compute::{Batch, ComputeBackend, DeviceModel, Error, Out};

/// The CPU backend (2 threads): the conformance suite's `batch::*` cases
/// cover every backend; these are the CPU's edge cases, bit for bit.
fn backend() -> Box<dyn ComputeBackend> {
    Box::new(CpuBackend::with_options(2, Kernels::detect(), Precision::Quantized).unwrap())
}

fn model(seed: u64) -> Box<dyn DeviceModel> {
    backend().prepare(&random_model(seed, Arch::Gemma3)).unwrap()
}

fn toks(seed: u32, n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (seed.wrapping_mul(7919).wrapping_add(i * 131 + 17)) % n_vocab as u32).collect()
}

/// The logits of every token of `seq` run alone on a fresh one-slot cache,
/// one token per step.
fn alone_rows(m: &mut dyn DeviceModel, seq: &[u32]) -> Vec<Vec<f32>> {
    let mut kv = m.new_kv_cache(seq.len().max(1)).unwrap();
    seq.iter().enumerate().map(|(p, &t)| m.decode_token(kv.as_mut(), t, p).unwrap().to_vec()).collect()
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        panic!("{what}: logit {i} is {}, alone {}", got[i], want[i]);
    }
}

fn inner(e: Error) -> Error {
    match e {
        Error::InBatch { source, .. } => *source,
        e => e,
    }
}

#[test]
fn n_ctx_one() {
    let mut m = model(1);
    let nv = m.n_vocab();
    let mut pool = m.new_kv_pool(3, 1).unwrap();
    let mut b = Batch::new();
    for s in [2usize, 0, 1] {
        b.push_seq(s, 0, &[s as u32 + 5], Out::Last);
    }
    let got = m.forward(pool.as_mut(), &b).unwrap().to_vec();
    assert_eq!(got.len(), 3 * nv);
    for (r, s) in [2u32, 0, 1].into_iter().enumerate() {
        let want = alone_rows(m.as_mut(), &[s + 5]);
        same_bits(&format!("slot {s}"), &got[r * nv..(r + 1) * nv], &want[0]);
    }
    for s in 0..3 {
        assert_eq!(pool.seq_len(s).unwrap(), 1);
    }
    let e = m.forward(pool.as_mut(), &Batch::seq(0, 1, &[1], Out::Last)).unwrap_err();
    assert!(matches!(inner(e), Error::ContextOverflow { .. }));
    // Rewinding the only position is fine.
    m.forward(pool.as_mut(), &Batch::seq(0, 0, &[9], Out::Last)).unwrap();
    assert!(matches!(m.new_kv_pool(3, 0), Err(Error::EmptyKvCache)));
    assert!(matches!(m.new_kv_pool(0, 3), Err(Error::EmptyKvCache)));
}

#[test]
fn copy_prefix_edges() {
    let mut m = model(2);
    let nv = m.n_vocab();
    let a = toks(1, 6, nv);
    let bseq = toks(2, 8, nv);
    let want_a = alone_rows(m.as_mut(), &a);
    let mut pool = m.new_kv_pool(3, 8).unwrap();
    m.forward(pool.as_mut(), &Batch::seq(0, 0, &a[..4], Out::None)).unwrap();
    m.forward(pool.as_mut(), &Batch::seq(1, 0, &bseq, Out::None)).unwrap();
    // Onto a fuller slot: slot 1 (8 positions) becomes a's first 2.
    pool.copy_prefix(0, 1, 2).unwrap();
    assert_eq!(pool.seq_len(1).unwrap(), 2);
    assert_eq!(pool.seq_len(0).unwrap(), 4);
    let got = m.forward(pool.as_mut(), &Batch::seq(1, 2, &a[2..6], Out::All)).unwrap().to_vec();
    for r in 0..4 {
        same_bits(&format!("copied slot, pos {}", r + 2), &got[r * nv..(r + 1) * nv], &want_a[r + 2]);
    }
    // n = 0: empties the target.
    pool.copy_prefix(0, 1, 0).unwrap();
    assert_eq!(pool.seq_len(1).unwrap(), 0);
    let got = m.forward(pool.as_mut(), &Batch::seq(1, 0, &a[..1], Out::Last)).unwrap().to_vec();
    same_bits("after copy of 0", &got, &want_a[0]);
    // Errors.
    assert!(matches!(pool.copy_prefix(0, 1, 5), Err(Error::PositionGap { .. })));
    assert!(matches!(pool.copy_prefix(0, 0, 0), Err(Error::Shape { .. }) | Err(_)));
    assert!(matches!(pool.copy_prefix(0, 3, 0), Err(Error::SlotOutOfRange { .. })));
    assert!(matches!(pool.copy_prefix(3, 0, 0), Err(Error::SlotOutOfRange { .. })));
    // An empty slot copied: n = 0 of an empty slot.
    pool.copy_prefix(2, 0, 0).unwrap();
    assert_eq!(pool.seq_len(0).unwrap(), 0);
}

#[test]
fn rewind_and_out_of_order() {
    let mut m = model(3);
    let nv = m.n_vocab();
    let seqs: Vec<Vec<u32>> = (0..4).map(|i| toks(10 + i, 7, nv)).collect();
    let mut pool = m.new_kv_pool(4, 10).unwrap();
    // Fill every slot with 6 positions of garbage, then rewind each.
    let mut b = Batch::new();
    for s in 0..4 {
        b.push_seq(s, 0, &toks(99 + s as u32, 6, nv), Out::None);
    }
    m.forward(pool.as_mut(), &b).unwrap();
    // Slot 3 rewinds to 0 and runs its whole sequence, slot 1 to 0 too;
    // slots 0 and 2 rewind to 0 with one token (spans of one).
    let mut b = Batch::new();
    b.push_seq(3, 0, &seqs[3], Out::All);
    b.push_seq(1, 0, &seqs[1][..3], Out::All);
    b.push_seq(2, 0, &seqs[2][..1], Out::Last);
    b.push_seq(0, 0, &seqs[0][..1], Out::Last);
    let got = m.forward(pool.as_mut(), &b).unwrap().to_vec();
    assert_eq!(got.len(), (7 + 3 + 1 + 1) * nv);
    let want: Vec<Vec<Vec<f32>>> = seqs.iter().map(|s| alone_rows(m.as_mut(), s)).collect();
    let mut r = 0;
    for (slot, n) in [(3usize, 7usize), (1, 3), (2, 1), (0, 1)] {
        for p in 0..n {
            same_bits(&format!("slot {slot} pos {p}"), &got[r * nv..(r + 1) * nv], &want[slot][p]);
            r += 1;
        }
        assert_eq!(pool.seq_len(slot).unwrap(), n);
    }
    // A rewind into the middle.
    let got = m.forward(pool.as_mut(), &Batch::seq(3, 4, &seqs[3][4..6], Out::All)).unwrap().to_vec();
    same_bits("rewound mid", &got[nv..], &want[3][5]);
    assert_eq!(pool.seq_len(3).unwrap(), 6);
}

#[test]
fn many_one_token_spans() {
    let mut m = model(4);
    let nv = m.n_vocab();
    let n_slots = 70;
    let seqs: Vec<Vec<u32>> = (0..n_slots as u32).map(|i| toks(200 + i, 3, nv)).collect();
    let mut pool = m.new_kv_pool(n_slots, 4).unwrap();
    for p in 0..3 {
        let mut b = Batch::new();
        // Reverse order each other step.
        let order: Vec<usize> = if p % 2 == 0 { (0..n_slots).collect() } else { (0..n_slots).rev().collect() };
        for &s in &order {
            b.push_seq(s, p, &seqs[s][p..p + 1], Out::Last);
        }
        let got = m.forward(pool.as_mut(), &b).unwrap().to_vec();
        if p == 2 {
            for (r, &s) in order.iter().enumerate() {
                let want = alone_rows(m.as_mut(), &seqs[s]);
                same_bits(&format!("slot {s}"), &got[r * nv..(r + 1) * nv], &want[2]);
            }
        }
    }
}

#[test]
fn more_than_512_tokens() {
    let mut m = model(5);
    let nv = m.n_vocab();
    let a = toks(7, 600, nv);
    let c = toks(8, 40, nv);
    let mut pool = m.new_kv_pool(2, 640).unwrap();
    let mut b = Batch::seq(0, 0, &a, Out::All);
    b.push_seq(1, 0, &c, Out::Last);
    let got = m.forward(pool.as_mut(), &b).unwrap().to_vec();
    assert_eq!(got.len(), 601 * nv);
    let want = alone_rows(m.as_mut(), &a);
    for p in [0usize, 1, 255, 511, 512, 513, 599] {
        same_bits(&format!("pos {p}"), &got[p * nv..(p + 1) * nv], &want[p]);
    }
    let wc = alone_rows(m.as_mut(), &c);
    same_bits("second slot", &got[600 * nv..], &wc[39]);
}

#[test]
fn no_wanted_rows() {
    let mut m = model(6);
    let nv = m.n_vocab();
    let a = toks(3, 5, nv);
    let mut pool = m.new_kv_pool(2, 8).unwrap();
    let mut b = Batch::seq(0, 0, &a[..4], Out::None);
    b.push_seq(1, 0, &a[..1], Out::None);
    assert!(m.forward(pool.as_mut(), &b).unwrap().is_empty());
    assert_eq!(pool.seq_len(0).unwrap(), 4);
    assert_eq!(pool.seq_len(1).unwrap(), 1);
    let got = m.forward(pool.as_mut(), &Batch::seq(0, 4, &a[4..], Out::Last)).unwrap().to_vec();
    same_bits("after no rows", &got, &alone_rows(m.as_mut(), &a)[4]);
}

#[test]
fn foreign_pools() {
    let mut m = model(7);
    let mut other = model(7);
    let mut pool = other.new_kv_pool(2, 4).unwrap();
    let e = m.forward(pool.as_mut(), &Batch::seq(0, 0, &[1], Out::Last)).unwrap_err();
    assert!(matches!(e, Error::ForeignKvCache), "{e:?}");
    assert!(matches!(m.decode_token(pool.as_mut(), 1, 0), Err(Error::ForeignKvCache)));
    assert_eq!(pool.seq_len(0).unwrap(), 0);
    // A context of `other` shares its pools.
    let mut ctx = other.new_context().unwrap();
    let got = ctx.forward(pool.as_mut(), &Batch::seq(1, 0, &[1, 2], Out::Last)).unwrap().to_vec();
    same_bits("context", &got, &alone_rows(other.as_mut(), &[1, 2])[1]);
    // Errors leave every slot as it was.
    let mut b = Batch::seq(0, 0, &[1, 2], Out::Last);
    b.push_seq(1, 5, &[1], Out::Last);
    let e = ctx.forward(pool.as_mut(), &b).unwrap_err();
    assert!(matches!(e, Error::InBatch { index: 2, .. }), "{e:?}");
    assert_eq!(pool.seq_len(0).unwrap(), 0);
    assert_eq!(pool.seq_len(1).unwrap(), 2);
    let mut b = Batch::seq(1, 2, &[3], Out::Last);
    b.push_seq(1, 0, &[3], Out::Last);
    assert!(matches!(inner(ctx.forward(pool.as_mut(), &b).unwrap_err()), Error::SlotRepeated { slot: 1 }));
    assert!(matches!(
        inner(ctx.forward(pool.as_mut(), &Batch::seq(2, 0, &[3], Out::Last)).unwrap_err()),
        Error::SlotOutOfRange { slot: 2, n_slots: 2 }
    ));
    assert!(matches!(ctx.forward(pool.as_mut(), &Batch::new()), Err(Error::EmptyBatch)));
    assert_eq!(pool.seq_len(1).unwrap(), 2);
}

#[test]
fn two_contexts_two_threads() {
    let mut m = model(8);
    let nv = m.n_vocab();
    let seqs: Vec<Vec<u32>> = (0..2).map(|i| toks(300 + i, 40, nv)).collect();
    let want: Vec<Vec<Vec<f32>>> = seqs.iter().map(|s| alone_rows(m.as_mut(), s)).collect();
    let ctxs: Vec<Box<dyn DeviceModel>> = (0..2).map(|_| m.new_context().unwrap()).collect();
    let got: Vec<Vec<Vec<f32>>> = std::thread::scope(|sc| {
        let hs: Vec<_> = ctxs
            .into_iter()
            .zip(&seqs)
            .map(|(mut c, s)| {
                sc.spawn(move || {
                    let mut pool = c.new_kv_pool(2, 48).unwrap();
                    let mut rows = Vec::new();
                    for round in 0..3 {
                        pool.reset(1).unwrap();
                        // A prompt chunk then one token at a time.
                        let l = c.forward(pool.as_mut(), &Batch::seq(1, 0, &s[..10], Out::All)).unwrap();
                        if round == 2 {
                            rows.extend(l.chunks_exact(nv).map(<[f32]>::to_vec));
                        }
                        for (p, &t) in s.iter().enumerate().skip(10) {
                            let l = c.forward(pool.as_mut(), &Batch::seq(1, p, &[t], Out::Last)).unwrap();
                            if round == 2 {
                                rows.push(l.to_vec());
                            }
                        }
                    }
                    rows
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, rows) in got.iter().enumerate() {
        for (p, r) in rows.iter().enumerate() {
            same_bits(&format!("thread {i} pos {p}"), r, &want[i][p]);
        }
    }
}

/// A pool of impossibly many slots is an error before anything large is
/// allocated: the size overflows, or the slots' bookkeeping is refused.
#[test]
fn huge_n_slots() {
    let m = model(9);
    for n_slots in [usize::MAX, usize::MAX / 2, 1usize << 60, 1 << 56, 1 << 40] {
        let r = m.new_kv_pool(n_slots, 1);
        assert!(matches!(r, Err(Error::Overflow(_) | Error::OutOfMemory { .. })), "n_slots {n_slots}: {:?}", r.err());
    }
}
