//! A TCP proxy between a client and its server that injects network faults, per direction:
//! latency, stalls (bytes held, connection kept open, as in a partition), cuts of every open
//! connection, random cuts, connections that break after a few chunks (a flapping link), and
//! refusing new connections (a server that is down). It also counts the chunks it reads each
//! way, so a test can tell one pipelined request from many.
//!
//! Each connection is served by two reader threads (one per direction), each feeding a writer
//! thread through a queue stamped with the time a chunk may leave, so latency delays bytes
//! without slowing the stream down to one chunk per latency.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which way bytes travel through the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the server.
    ToServer,
    /// From the server to the client.
    ToClient,
    /// Both ways.
    Both,
}

impl Direction {
    /// The indices of [`Faults`]' per-direction settings this direction names.
    fn indices(self) -> &'static [usize] {
        match self {
            Direction::ToServer => &[0],
            Direction::ToClient => &[1],
            Direction::Both => &[0, 1],
        }
    }
}

/// The faults in force now, read by every pump on every chunk.
#[derive(Default)]
struct Faults {
    stalled: [AtomicBool; 2],
    latency_micros: [AtomicU64; 2],
    /// Chance, in millionths, that forwarding a chunk cuts its connection.
    cut_chance_ppm: AtomicU64,
    /// Per direction: how many chunks a connection carries before it is cut instead of
    /// carrying another; 0, no such limit ([`FaultProxy::break_after`]).
    break_after: [AtomicU64; 2],
    refusing: AtomicBool,
    /// Whether a new connection starts stalled both ways ([`FaultProxy::stall_new_connections`]).
    stall_new: AtomicBool,
    /// Per direction: how many chunks a new connection carries before it holds the rest; 0, no
    /// such limit ([`FaultProxy::stall_new_connections_after`]).
    stall_new_after: [AtomicU64; 2],
    /// How long, in milliseconds, a new connection waits for its target to accept before the
    /// proxy gives up on it (closing the client's side); 0: one try.
    connect_patience_ms: AtomicU64,
    /// Where new connections go; [`FaultProxy::retarget`] moves it, as a fail-over moves a
    /// service's address to the new primary.
    target: Mutex<Option<SocketAddr>>,
    cuts: AtomicU64,
    /// Chunks read so far, per direction.
    chunks: [AtomicU64; 2],
    rng: Mutex<u64>,
    open: Mutex<Vec<Arc<Connection>>>,
}

impl Faults {
    /// A uniform draw in `0..1_000_000` (splitmix64: quality enough to place faults).
    fn draw_ppm(&self) -> u64 {
        let mut state = self.rng.lock().unwrap();
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % 1_000_000
    }
}

/// One proxied connection: both sockets, so a cut can close them from any thread.
struct Connection {
    client: TcpStream,
    server: TcpStream,
    closed: AtomicBool,
    /// Stalls of this connection alone, per direction ([`FaultProxy::stall_open`]).
    stalled: [AtomicBool; 2],
    /// Chunks this connection has carried, per direction.
    forwarded: [AtomicU64; 2],
    /// Per direction: how many chunks this connection carries before it holds the rest (0: no
    /// limit), until `resume`.
    stall_after: [AtomicU64; 2],
}

impl Connection {
    /// Whether this connection has carried as many chunks going direction `index` as it may
    /// before it holds the rest ([`FaultProxy::stall_new_connections_after`]).
    fn holds_beyond_limit(&self, index: usize) -> bool {
        let limit = self.stall_after[index].load(Ordering::SeqCst);
        limit > 0 && self.forwarded[index].load(Ordering::SeqCst) >= limit
    }

    /// Closes both sockets; false if the connection was closed already.
    fn cut(&self) -> bool {
        if self.closed.swap(true, Ordering::SeqCst) {
            return false;
        }
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
        true
    }
}

/// The proxy; it serves until the test process ends.
pub struct FaultProxy {
    port: u16,
    faults: Arc<Faults>,
}

impl FaultProxy {
    /// A proxy on a free port of 127.0.0.1 forwarding to `target` (`host:port`), with no faults.
    pub fn start(target: &str) -> FaultProxy {
        let target: SocketAddr = target.parse().expect("target must be an ip:port");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let faults = Arc::new(Faults {
            rng: Mutex::new(u64::from(port) ^ std::process::id() as u64),
            target: Mutex::new(Some(target)),
            ..Faults::default()
        });
        let shared = faults.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if shared.refusing.load(Ordering::SeqCst) {
                    drop(client); // closed at once: as good as a refused connection
                    continue;
                }
                let target = shared
                    .target
                    .lock()
                    .unwrap()
                    .expect("a target is always set");
                let patience = shared.connect_patience_ms.load(Ordering::SeqCst);
                if patience == 0 {
                    if let Ok(server) = TcpStream::connect(target) {
                        serve(client, server, &shared);
                    }
                    continue;
                }
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_millis(patience);
                    loop {
                        match TcpStream::connect(target) {
                            Ok(server) => return serve(client, server, &shared),
                            Err(_) if Instant::now() < deadline => {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            Err(_) => return,
                        }
                    }
                });
            }
        });
        FaultProxy { port, faults }
    }

    /// A proxy to the server `url` names (`scheme://[user@]host:port[/…]`), and the same URL
    /// pointing at the proxy instead.
    pub fn in_front_of(url: &str) -> (FaultProxy, String) {
        let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
        let authority_end = rest.find(['/', '?', ',']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        let (user, host_port) = match authority.rsplit_once('@') {
            Some((user, host_port)) => (format!("{user}@"), host_port),
            None => (String::new(), authority),
        };
        let host_port = host_port.replace("localhost", "127.0.0.1");
        let proxy = FaultProxy::start(&host_port);
        let redirected = format!("{scheme}://{user}127.0.0.1:{}{path}", proxy.port);
        (proxy, redirected)
    }

    /// The port the proxy listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Holds every byte going `direction` from now on, keeping the connections open.
    pub fn stall(&self, direction: Direction) {
        for &i in direction.indices() {
            self.faults.stalled[i].store(true, Ordering::SeqCst);
        }
    }

    /// Holds every byte going `direction` on the connections open now, and only on those: a
    /// connection that hangs while a fresh one would get through. `resume` ends it.
    pub fn stall_open(&self, direction: Direction) {
        for connection in self.faults.open.lock().unwrap().iter() {
            for &i in direction.indices() {
                connection.stalled[i].store(true, Ordering::SeqCst);
            }
        }
    }

    /// Holds every byte going `direction` on the connection opened last, and only on that one:
    /// a connection that went silent (forgotten by a NAT, say) while the others work. `resume`
    /// ends it.
    pub fn stall_newest(&self, direction: Direction) {
        let open = self.faults.open.lock().unwrap();
        let newest = open.last().expect("no connection is open");
        for &i in direction.indices() {
            newest.stalled[i].store(true, Ordering::SeqCst);
        }
    }

    /// Forwards `direction` again, the held bytes first.
    pub fn resume(&self, direction: Direction) {
        for &i in direction.indices() {
            self.faults.stalled[i].store(false, Ordering::SeqCst);
            self.faults.stall_new_after[i].store(0, Ordering::SeqCst);
        }
        for connection in self.faults.open.lock().unwrap().iter() {
            for &i in direction.indices() {
                connection.stalled[i].store(false, Ordering::SeqCst);
                connection.stall_after[i].store(0, Ordering::SeqCst);
            }
        }
    }

    /// From now on, a new connection carries `chunks` chunks going `direction`, then holds every
    /// further one, kept open, until `resume`; the connections open now are left alone. Set to
    /// the chunks of a client's handshake, a fresh connection is set up and then hangs on its
    /// first request, while the older ones work.
    pub fn stall_new_connections_after(&self, direction: Direction, chunks: u64) {
        for &i in direction.indices() {
            self.faults.stall_new_after[i].store(chunks, Ordering::SeqCst);
        }
    }

    /// Closes the connection opened last, both ways, as a reset of that one connection would.
    pub fn cut_newest(&self) {
        let open = self.faults.open.lock().unwrap();
        let newest = open.last().expect("no connection is open");
        if newest.cut() {
            self.faults.cuts.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Closes the client's side of the connection opened last, and only that side: the client
    /// sees its connection dropped, while what the proxy holds of it going to the server (a
    /// stall) is still delivered once resumed, as a request held up in the network would be.
    pub fn cut_client_side_of_newest(&self) {
        let open = self.faults.open.lock().unwrap();
        let newest = open.last().expect("no connection is open");
        let _ = newest.client.shutdown(Shutdown::Both);
        self.faults.cuts.fetch_add(1, Ordering::SeqCst);
    }

    /// Stalls `direction` for `period`, then resumes it (in the background).
    pub fn stall_for(&self, direction: Direction, period: Duration) {
        self.stall(direction);
        let faults = self.faults.clone();
        std::thread::spawn(move || {
            std::thread::sleep(period);
            for &i in direction.indices() {
                faults.stalled[i].store(false, Ordering::SeqCst);
            }
        });
    }

    /// Delays every chunk going `direction` by `latency`.
    pub fn set_latency(&self, direction: Direction, latency: Duration) {
        for &i in direction.indices() {
            self.faults.latency_micros[i].store(latency.as_micros() as u64, Ordering::SeqCst);
        }
    }

    /// Closes every open connection now, both ways, as a crashed server or a reset would.
    pub fn cut_all(&self) {
        for connection in self.faults.open.lock().unwrap().drain(..) {
            if connection.cut() {
                self.faults.cuts.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// From now on, forwarding a chunk cuts its connection with chance `chance` (0 to 1).
    pub fn cut_randomly(&self, chance: f64) {
        let ppm = (chance.clamp(0.0, 1.0) * 1_000_000.0) as u64;
        self.faults.cut_chance_ppm.store(ppm, Ordering::SeqCst);
    }

    /// From now on, a connection that has carried `chunks` chunks going `direction` is cut
    /// instead of carrying another (that one is lost); 0 lifts the limit. Set to the chunks of
    /// a client's handshake toward its server, a flapping link: every new connection is set up,
    /// then breaks on the first request.
    pub fn break_after(&self, direction: Direction, chunks: u64) {
        for &i in direction.indices() {
            self.faults.break_after[i].store(chunks, Ordering::SeqCst);
        }
    }

    /// From now on, a new connection whose target refuses it is tried again for up to
    /// `patience` before the proxy closes it. A peer that retries a refused connection by
    /// itself (a ZooKeeper follower dialling a leader that is still opening its port) would
    /// otherwise see an accepted connection close, and take that for a failure of the leader.
    pub fn retry_refused_for(&self, patience: Duration) {
        let millis = u64::try_from(patience.as_millis()).unwrap_or(u64::MAX);
        self.faults
            .connect_patience_ms
            .store(millis, Ordering::SeqCst);
    }

    /// While `refusing`, new connections are closed as soon as they are accepted.
    pub fn refuse_connections(&self, refusing: bool) {
        self.faults.refusing.store(refusing, Ordering::SeqCst);
    }

    /// While `stalling`, a new connection is accepted and connected to the target, then holds
    /// every byte both ways, while the connections open before go on: a client's fresh connection
    /// hangs (a firewall or a load balancer gone bad) though its old ones work. `resume` frees
    /// the connections stalled so.
    pub fn stall_new_connections(&self, stalling: bool) {
        self.faults.stall_new.store(stalling, Ordering::SeqCst);
    }

    /// Sends new connections to `target` (`ip:port`) from now on; open ones stay where they are
    /// (cut them with [`cut_all`](Self::cut_all)).
    pub fn retarget(&self, target: &str) {
        let target: SocketAddr = target.parse().expect("target must be an ip:port");
        *self.faults.target.lock().unwrap() = Some(target);
    }

    /// How many connections the proxy has cut so far.
    pub fn cuts(&self) -> u64 {
        self.faults.cuts.load(Ordering::SeqCst)
    }

    /// How many chunks the proxy has read going `direction` so far, over every connection. A
    /// chunk is what one read returned: what a peer wrote in one go (a pipeline of requests
    /// included) arrives as one, N requests written one at a time as N.
    pub fn chunks(&self, direction: Direction) -> u64 {
        direction
            .indices()
            .iter()
            .map(|&i| self.faults.chunks[i].load(Ordering::SeqCst))
            .sum()
    }
}

/// Starts the four threads of one connection.
fn serve(client: TcpStream, server: TcpStream, faults: &Arc<Faults>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let connection = Arc::new(Connection {
        client: client.try_clone().unwrap(),
        server: server.try_clone().unwrap(),
        closed: AtomicBool::new(false),
        stalled: std::array::from_fn(|_| AtomicBool::new(faults.stall_new.load(Ordering::SeqCst))),
        forwarded: Default::default(),
        stall_after: std::array::from_fn(|i| {
            AtomicU64::new(faults.stall_new_after[i].load(Ordering::SeqCst))
        }),
    });
    {
        let mut open = faults.open.lock().unwrap();
        open.retain(|c| !c.closed.load(Ordering::SeqCst));
        open.push(connection.clone());
    }
    let to_server = (client.try_clone().unwrap(), server.try_clone().unwrap());
    pump(
        to_server.0,
        to_server.1,
        0,
        faults.clone(),
        connection.clone(),
    );
    pump(server, client, 1, faults.clone(), connection);
}

/// Copies `from` to `to` through a queue, applying the faults of direction `index`.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    index: usize,
    faults: Arc<Faults>,
    connection: Arc<Connection>,
) {
    let (queue, chunks) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_faults = faults.clone();
    std::thread::spawn(move || {
        // Larger than a pipeline of a hundred requests, so that one arrives as one chunk.
        let mut buffer = vec![0; 64 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    reader_faults.chunks[index].fetch_add(1, Ordering::SeqCst);
                    let latency = reader_faults.latency_micros[index].load(Ordering::SeqCst);
                    let due = Instant::now() + Duration::from_micros(latency);
                    if queue.send((due, buffer[..read].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (due, chunk) in chunks {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            while faults.stalled[index].load(Ordering::SeqCst)
                || connection.stalled[index].load(Ordering::SeqCst)
                || connection.holds_beyond_limit(index)
            {
                if connection.closed.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let limit = faults.break_after[index].load(Ordering::SeqCst);
            if limit > 0 && connection.forwarded[index].load(Ordering::SeqCst) >= limit {
                if connection.cut() {
                    faults.cuts.fetch_add(1, Ordering::SeqCst);
                }
                return;
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
            connection.forwarded[index].fetch_add(1, Ordering::SeqCst);
            let chance = faults.cut_chance_ppm.load(Ordering::SeqCst);
            if chance > 0 && faults.draw_ppm() < chance {
                if connection.cut() {
                    faults.cuts.fetch_add(1, Ordering::SeqCst);
                }
                return;
            }
        }
        // The source closed: pass the end on, as TCP would.
        let _ = to.shutdown(Shutdown::Write);
    });
}
