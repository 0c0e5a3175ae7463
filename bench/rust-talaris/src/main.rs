//! Bench client for `talaris bench`, built on the Rust `talaris` crate
//! (crates.io; the version Cargo.lock resolved is compiled in by build.rs and
//! printed in every RESULT line). It drives the same feed server as the Go
//! clients (the hidden `talaris feed-server` subcommand) and prints one line:
//!
//!   RESULT {"crate":"talaris 1.0.0-rc4","frames":..,"bytes":..,"secs":..,"cpu_s":..,
//!           "threads":[{"tid":..,"name":"..","cpu_s":..},..],"sum":..,"ns_per_msg":..,
//!           "p50_us":..,"p99_us":..,"p999_us":..,"max_us":..,"cdf":[[pct,us],..]}
//!
//! `threads` is the CPU time of each thread of this process over the measured
//! interval (ingress only), so the driver can report CPU per frame per thread.
//!
//! The data path is the crate's fastest (1.0): batch data dispatch
//! (`pump_data_batches`: one sink call per run of up to 32 data messages of a
//! plaintext chunk) and, with --spin, the busy-poll `pump_data_spin_batches`.
//! `--per-event` selects the one-call-per-message pumps instead (A/B only).
//!
//! Usage:
//!   rust-talaris-bench version
//!   rust-talaris-bench decode  --n 100000 [--rounds 3] [--batch]
//!   rust-talaris-bench ingress --addr 127.0.0.1:P --path /flood?size=64 --conns N
//!                              --warmup-ms W --duration-ms D [--tls --ca FILE] [--spin] [--cpu C]
//!                              [--per-event] [--bundle] [--copy-batch BYTES] [--post-spin N]
//!                              [--slot BYTES] [--slots N] [--cq N]
//!   rust-talaris-bench latency --addr .. --path /paced?.. (same flags)
//!   rust-talaris-bench rtt     --addr .. --path /echo (same flags)
#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use talaris::connection_meta::{ConnectionConfig, RecvMode, State};
use talaris::ws::{DataEvent as WsDataEvent, DataEventBatch};
use talaris::{Pool, PoolConfig};

/// The `talaris` crate version this binary was built against (build.rs).
const CRATE_VERSION: &str = env!("TALARIS_CRATE_VERSION");

struct Args {
    mode: String,
    addr: String,
    path: String,
    conns: usize,
    warmup: Duration,
    duration: Duration,
    tls: bool,
    ca: String,
    spin: bool,
    cpu: Option<usize>,
    n: usize,
    rounds: usize,
    per_event: bool,
    batch: bool,
    bundle: bool,
    copy_batch: usize,
    post_spin: usize,
    slot: u32,
    slots: u16,
    cq: u32,
}

fn parse_args() -> Args {
    let mut a = Args {
        mode: String::new(),
        addr: "127.0.0.1:0".into(),
        path: "/".into(),
        conns: 1,
        warmup: Duration::from_millis(300),
        duration: Duration::from_secs(2),
        tls: false,
        ca: String::new(),
        spin: false,
        cpu: None,
        n: 100_000,
        rounds: 3,
        per_event: false,
        batch: false,
        bundle: false,
        copy_batch: 0,
        post_spin: 0,
        slot: 16 * 1024,
        slots: 256,
        cq: 0,
    };
    let mut it = std::env::args().skip(1);
    a.mode = it.next().unwrap_or_default();
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_default();
        match k.as_str() {
            "--addr" => a.addr = v(),
            "--path" => a.path = v(),
            "--conns" => a.conns = v().parse().unwrap_or(1),
            "--warmup-ms" => a.warmup = Duration::from_millis(v().parse().unwrap_or(300)),
            "--duration-ms" => a.duration = Duration::from_millis(v().parse().unwrap_or(2000)),
            "--tls" => a.tls = true,
            "--ca" => a.ca = v(),
            "--spin" => a.spin = true,
            "--cpu" => a.cpu = v().parse().ok(),
            "--n" => a.n = v().parse().unwrap_or(100_000),
            "--rounds" => a.rounds = v().parse().unwrap_or(3),
            "--per-event" => a.per_event = true,
            "--batch" => a.batch = true,
            "--bundle" => a.bundle = true,
            "--copy-batch" => a.copy_batch = v().parse().unwrap_or(0),
            "--post-spin" => a.post_spin = v().parse().unwrap_or(0),
            "--slot" => a.slot = v().parse().unwrap_or(16 * 1024),
            "--slots" => a.slots = v().parse().unwrap_or(256),
            "--cq" => a.cq = v().parse().unwrap_or(0),
            other => fail(&format!("unknown flag {other}")),
        }
    }
    a
}

fn fail(msg: &str) -> ! {
    eprintln!("rust-talaris-bench: {msg}");
    std::process::exit(2)
}

fn cpu_secs() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One thread's CPU time (user + system) at a point in time.
#[derive(Clone)]
struct ThreadCpu {
    tid: i32,
    name: String,
    cpu: f64,
}

/// thread_cpu reads the CPU time of thread tid of this process: its
/// per-thread CPU clock (nanosecond resolution; MAKE_THREAD_CPUCLOCK(tid,
/// CPUCLOCK_SCHED) in the kernel's posix-cpu-timers), else utime + stime from
/// /proc/self/task/<tid>/stat (clock ticks).
fn thread_cpu(tid: i32) -> Option<f64> {
    let clock = ((!(tid as u32)) << 3 | 6) as libc::clockid_t;
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    if unsafe { libc::clock_gettime(clock, &raw mut ts) } == 0 {
        return Some(ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9);
    }
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // Fields after the parenthesised comm: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / ticks)
}

/// threads_cpu snapshots every thread of this process (/proc/self/task).
fn threads_cpu() -> Vec<ThreadCpu> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return out };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let name = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default().trim().to_owned();
        if let Some(cpu) = thread_cpu(tid) {
            out.push(ThreadCpu { tid, name, cpu });
        }
    }
    out
}

/// threads_delta is each thread's CPU time between two snapshots (a thread
/// born in between counts from zero).
fn threads_delta(before: &[ThreadCpu], after: &[ThreadCpu]) -> Vec<ThreadCpu> {
    after
        .iter()
        .map(|t| {
            let b = before.iter().find(|x| x.tid == t.tid).map_or(0.0, |x| x.cpu);
            ThreadCpu { tid: t.tid, name: t.name.clone(), cpu: (t.cpu - b).max(0.0) }
        })
        .collect()
}

fn wall_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    d.as_nanos() as i64
}

fn tls_config(ca: &str) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca).unwrap_or_else(|e| fail(&format!("read CA {ca}: {e}")));
    for c in certs {
        let c = c.unwrap_or_else(|e| fail(&format!("parse CA {ca}: {e}")));
        roots.add(c).unwrap_or_else(|e| fail(&format!("add CA: {e}")));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| fail(&format!("tls: {e}")))
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

fn connect(pool: &mut Pool, a: &Args, n: usize) -> Vec<talaris::ConnHandle> {
    let addr: SocketAddr = a.addr.parse().unwrap_or_else(|e| fail(&format!("addr {}: {e}", a.addr)));
    let tls = if a.tls { Some(tls_config(&a.ca)) } else { None };
    let mut hs = Vec::with_capacity(n);
    for _ in 0..n {
        // "localhost" is the SNI / certificate name of the feed server's test cert.
        // Receive slots: 16 KiB x 256 by default. 1.0 bounds a connection's
        // receive buffer to 16 KiB (http::MAX_RESPONSE_HEADER_BYTES) until
        // the 101 is parsed, and the feed floods right behind its 101: a
        // larger slot (0.9's 64 KiB here) carries 101 + flood in one
        // completion and the handshake fails "receive buffer exceeded" (seen
        // at 16 connections even with the data pump below). 0.9 had no bound.
        let mut cfg = ConnectionConfig::new("localhost", addr.port(), a.path.clone())
            .with_tls(a.tls)
            .with_buf_ring(a.slot, a.slots)
            .with_plain_recv_batch_copy_max_bytes(a.copy_batch);
        if a.bundle {
            cfg = cfg.with_recv_mode(RecvMode::MultishotBundle);
        }
        if let Some(t) = &tls {
            cfg = cfg.with_tls_config(t.clone());
        }
        let h = pool.submit_connect_to(cfg, addr).unwrap_or_else(|e| fail(&format!("connect: {e}")));
        hs.push(h);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last_err = None;
    loop {
        // The data pump parses the 101 and the flood behind it in one pass;
        // the general pump (pump_nowait) first buffers every completion of a
        // batch while the handshake is pending, and 1.0 fails a flooded
        // handshake once that passes 16 KiB ("receive buffer exceeded").
        if let Err(e) = pool.pump_data_nowait(|_, _| {}) {
            last_err = Some(e.to_string());
        }
        let open = hs.iter().filter(|h| pool.state(**h) == Some(State::Open)).count();
        if open == n {
            break;
        }
        if let Some(h) = hs.iter().find(|h| matches!(pool.state(**h), Some(State::Closed) | None)) {
            fail(&format!(
                "a connection failed during the handshake (state {:?}, HTTP status {:?}, last pump error {:?}; {open} of {n} open)",
                pool.state(*h),
                pool.handshake_response_status(*h),
                last_err
            ));
        }
        if Instant::now() > deadline {
            fail("handshake timeout");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    hs
}

#[derive(Default)]
struct Out {
    frames: u64,
    bytes: u64,
    secs: f64,
    cpu: f64,
    sum: u64,
    ns_per_msg: f64,
    hist: Option<Histogram<u64>>,
    threads: Vec<ThreadCpu>,
}

fn print(o: &Out) {
    let mut s = format!(
        "RESULT {{\"crate\":\"talaris {CRATE_VERSION}\",\"frames\":{},\"bytes\":{},\"secs\":{:.6},\"cpu_s\":{:.6},\"sum\":{},\"ns_per_msg\":{:.3}",
        o.frames, o.bytes, o.secs, o.cpu, o.sum, o.ns_per_msg
    );
    if !o.threads.is_empty() {
        s += ",\"threads\":[";
        for (i, t) in o.threads.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let name: String = t.name.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').filter(|c| *c != '"' && *c != '\\').collect();
            s += &format!("{{\"tid\":{},\"name\":\"{}\",\"cpu_s\":{:.6}}}", t.tid, name, t.cpu);
        }
        s.push(']');
    }
    if let Some(h) = &o.hist {
        let us = |v: u64| v as f64 / 1000.0;
        s += &format!(
            ",\"count\":{},\"p50_us\":{:.3},\"p99_us\":{:.3},\"p999_us\":{:.3},\"max_us\":{:.3},\"cdf\":[",
            h.len(),
            us(h.value_at_quantile(0.5)),
            us(h.value_at_quantile(0.99)),
            us(h.value_at_quantile(0.999)),
            us(h.max())
        );
        let mut first = true;
        for q in cdf_quantiles() {
            if !first {
                s.push(',');
            }
            first = false;
            s += &format!("[{:.5},{:.3}]", q * 100.0, us(h.value_at_quantile(q)));
        }
        s.push(']');
    }
    s.push('}');
    println!("{s}");
}

fn cdf_quantiles() -> Vec<f64> {
    let mut v = Vec::new();
    // 0..90% in steps of 2, then log-spaced towards 99.999%.
    let mut q = 0.0;
    while q < 0.9 {
        v.push(q);
        q += 0.02;
    }
    let mut tail = 0.1_f64;
    while tail > 0.000_01 {
        for k in [1.0, 0.5, 0.25] {
            v.push(1.0 - tail * k);
        }
        tail /= 10.0;
    }
    v.push(1.0);
    v
}

/// payload is a data event's bytes (the enum is non-exhaustive: a future
/// kind counts as an empty message rather than failing the build).
fn payload<'a>(ev: WsDataEvent<'a>) -> &'a [u8] {
    match ev {
        WsDataEvent::Binary(p) => p,
        WsDataEvent::Text(s) => s.as_bytes(),
        _ => &[],
    }
}

fn new_pool(a: &Args) -> Pool {
    // The crate's defaults otherwise: in A/B runs (1.0.0-rc4, 64 connections
    // flooding) --bundle and --cq 16384 both stalled the flood (a pump that
    // never returned data again), so neither is the default.
    let mut proactor = talaris::proactor::ProactorConfig::default();
    if a.cq > 0 {
        proactor = proactor.with_cq_entries(a.cq);
    }
    let cfg = PoolConfig::new(proactor)
        .with_post_progress_spin_iters(a.post_spin)
        .with_initial_conn_capacity(a.conns);
    Pool::new(cfg).unwrap_or_else(|e| fail(&format!("pool: {e}")))
}

/// pump_step runs one pump call on the configured data path and hands every
/// data message's payload to f: batch dispatch unless --per-event, blocking
/// unless --spin (256 CQ polls per call, the crate's documented example).
fn pump_step(pool: &mut Pool, a: &Args, f: &mut impl FnMut(&[u8])) {
    let r = match (a.spin, a.per_event) {
        (false, false) => pool.pump_data_batches(|_, b: DataEventBatch<'_>| {
            for ev in b.iter() {
                f(payload(ev));
            }
        }),
        (true, false) => pool
            .pump_data_spin_batches(256, |_, b: DataEventBatch<'_>| {
                for ev in b.iter() {
                    f(payload(ev));
                }
            })
            .map(|_| ()),
        (false, true) => pool.pump_data(|_, ev| f(payload(ev))),
        (true, true) => pool.pump_data_spin(256, |_, ev| f(payload(ev))).map(|_| ()),
    };
    r.unwrap_or_else(|e| fail(&format!("pump: {e}")));
}

fn ingress(a: &Args) -> Out {
    let mut pool = new_pool(a);
    let _hs = connect(&mut pool, a, a.conns);
    let mut frames = 0u64;
    let mut bytes = 0u64;
    let t0 = Instant::now();
    let (mut f0, mut b0, mut c0, mut tstart) = (0, 0, 0.0, t0);
    let mut th0 = Vec::new();
    let mut started = false;
    loop {
        pump_step(&mut pool, a, &mut |p: &[u8]| {
            frames += 1;
            bytes += p.len() as u64;
        });
        let el = t0.elapsed();
        if !started && el >= a.warmup {
            started = true;
            (f0, b0, c0, tstart) = (frames, bytes, cpu_secs(), Instant::now());
            th0 = threads_cpu();
        }
        if started && el >= a.warmup + a.duration {
            break;
        }
    }
    let threads = threads_delta(&th0, &threads_cpu());
    Out {
        frames: frames - f0,
        bytes: bytes - b0,
        secs: tstart.elapsed().as_secs_f64(),
        cpu: cpu_secs() - c0,
        threads,
        ..Out::default()
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap_or_else(|e| fail(&format!("hist: {e}")))
}

fn latency(a: &Args) -> Out {
    let mut pool = new_pool(a);
    let _hs = connect(&mut pool, a, 1);
    let mut hist = new_hist();
    let t0 = Instant::now();
    let warm = a.warmup;
    let end = a.warmup + a.duration;
    let mut frames = 0u64;
    let mut bytes = 0u64;
    let mut recording = false;
    while t0.elapsed() < end {
        pump_step(&mut pool, a, &mut |p: &[u8]| {
            if recording && p.len() >= 16 {
                let sent = i64::from_le_bytes(p[8..16].try_into().unwrap_or([0; 8]));
                let d = (wall_ns() - sent).max(1) as u64;
                let _ = hist.record(d);
                frames += 1;
                bytes += p.len() as u64;
            }
        });
        recording = t0.elapsed() >= warm;
    }
    Out { frames, bytes, secs: a.duration.as_secs_f64(), hist: Some(hist), ..Out::default() }
}

fn rtt(a: &Args) -> Out {
    let mut pool = new_pool(a);
    let hs = connect(&mut pool, a, 1);
    let h = hs[0];
    let mut hist = new_hist();
    let mut msg = [0u8; 64];
    let t0 = Instant::now();
    let mut frames = 0u64;
    while t0.elapsed() < a.warmup + a.duration {
        msg[..8].copy_from_slice(&frames.to_le_bytes());
        let sent = Instant::now();
        pool.send_binary(h, &msg).unwrap_or_else(|e| fail(&format!("send: {e}")));
        let mut got = false;
        while !got {
            pump_step(&mut pool, a, &mut |_: &[u8]| got = true);
        }
        if t0.elapsed() >= a.warmup {
            let _ = hist.record(sent.elapsed().as_nanos().max(1) as u64);
        }
        frames += 1;
    }
    Out { frames: hist.len(), bytes: hist.len() * 64, secs: a.duration.as_secs_f64(), hist: Some(hist), ..Out::default() }
}

/// In-memory decode: the same mixed stream as the Go side (1/3 binary u64,
/// 2/3 text {"id":i}), fed in 4096-byte reads to the crate's WsClient after
/// an in-memory opening handshake.
fn decode(a: &Args) -> Out {
    use talaris::ws::client::{WsClient, WsConfig};
    use talaris::ws::DataEvent;
    let mut stream = Vec::new();
    for i in 0..a.n {
        if i % 3 == 0 {
            stream.extend_from_slice(&[0x82, 8]);
            stream.extend_from_slice(&(i as u64).to_le_bytes());
        } else {
            let t = format!("{{\"id\":{i}}}");
            stream.extend_from_slice(&[0x81, t.len() as u8]);
            stream.extend_from_slice(t.as_bytes());
        }
    }
    let want: u64 = (0..a.n as u64).sum();
    let mut best = f64::MAX;
    let mut sum = 0;
    for _ in 0..a.rounds {
        let mut c = WsClient::new_client(WsConfig::new("localhost", "/")).unwrap_or_else(|e| fail(&format!("ws: {e}")));
        c.begin_handshake().unwrap_or_else(|e| fail(&format!("ws: {e}")));
        let req = String::from_utf8_lossy(c.pending_tx()).into_owned();
        let n = c.pending_tx().len();
        c.ack_tx(n);
        let key = req
            .lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("sec-websocket-key")).map(|(_, v)| v.trim().to_owned()))
            .unwrap_or_else(|| fail("no key"));
        let resp = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
            talaris::ws::handshake::compute_accept(&key)
        );
        c.feed_recv(resp.as_bytes()).unwrap_or_else(|e| fail(&format!("handshake: {e}")));
        while let Some(ev) = c.poll_event() {
            ev.unwrap_or_else(|e| fail(&format!("handshake: {e}")));
        }
        sum = 0u64;
        let t = Instant::now();
        let mut add = |ev: DataEvent<'_>| match ev {
            DataEvent::Binary(p) => sum += u64::from_le_bytes(p[..8].try_into().unwrap_or([0; 8])),
            DataEvent::Text(s) => sum += parse_id(s.as_bytes()),
            _ => {}
        };
        for chunk in stream.chunks(4096) {
            // Per event unless --batch: in memory the batch drain measured
            // slower (8-9 vs 7.5 ns/msg, 1.0.0-rc4, best of 5, three runs).
            let r = if a.batch {
                c.drain_data_event_batches_from_ingress(chunk, |b| b.iter().for_each(&mut add))
            } else {
                c.drain_data_events_from_ingress(chunk, &mut add)
            };
            r.unwrap_or_else(|e| fail(&format!("decode: {e}")));
        }
        let ns = t.elapsed().as_nanos() as f64 / a.n as f64;
        if sum != want {
            fail(&format!("decode: sum {sum} want {want}"));
        }
        best = best.min(ns);
    }
    Out { frames: a.n as u64, sum, ns_per_msg: best, ..Out::default() }
}

fn parse_id(b: &[u8]) -> u64 {
    let mut v = 0u64;
    for &c in b.iter().skip(6) {
        if c.is_ascii_digit() {
            v = v * 10 + u64::from(c - b'0');
        } else {
            break;
        }
    }
    v
}

fn main() {
    let a = parse_args();
    if let Some(cpu) = a.cpu {
        let _ = talaris::proactor::pin_current_thread_to(cpu);
    }
    let o = match a.mode.as_str() {
        "version" => {
            println!("talaris {CRATE_VERSION}");
            return;
        }
        "decode" => decode(&a),
        "ingress" => ingress(&a),
        "latency" => latency(&a),
        "rtt" => rtt(&a),
        m => fail(&format!("unknown mode {m:?} (version|decode|ingress|latency|rtt)")),
    };
    print(&o);
}
