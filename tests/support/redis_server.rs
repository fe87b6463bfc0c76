//! A private `redis-server` for one test: on a free port, without persistence, stoppable and
//! restartable on the same port, killed on drop. Never the shared server on 6379.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    port: u16,
    password: Option<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        Self::start_with(None)
    }

    /// Starts a server that requires `password` (`--requirepass`).
    pub fn start_with_password(password: &str) -> RedisServer {
        Self::start_with(Some(password.to_owned()))
    }

    fn start_with(password: Option<String>) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            password,
            child: None,
        };
        server.spawn();
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, with the password if the server has one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => self.url_without_password(),
        }
    }

    pub fn url_without_password(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: no goodbye to its clients) and waits for it to be gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server if it runs, and starts it again on the same port (empty: nothing is
    /// saved).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let mut command = Command::new("redis-server");
        command.args([
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        command.args(["--dir", &std::env::temp_dir().to_string_lossy()]);
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null());
        let started = Instant::now();
        // The port was free a moment ago, and is free again right after a kill; retry a few
        // times in case the kernel takes a moment.
        loop {
            let child = command
                .spawn()
                .expect("cannot run redis-server: is it installed (apt-get install redis-server)?");
            self.child = Some(child);
            if self.wait_until_answering(Duration::from_secs(10)) {
                return;
            }
            self.stop();
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "redis-server on port {} did not start",
                self.port
            );
        }
    }

    fn wait_until_answering(&mut self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return false; // exited: port taken, most likely
                }
            }
            if let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
                let mut reply = [0u8; 64];
                if stream.write_all(b"PING\r\n").is_ok() {
                    if let Ok(n) = stream.read(&mut reply) {
                        // +PONG, or -NOAUTH where a password is required: it answers either way.
                        if n > 0
                            && (reply[0] == b'+' || reply[0] == b'-')
                            && !reply[..n].starts_with(b"-LOADING")
                        {
                            return true;
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}
