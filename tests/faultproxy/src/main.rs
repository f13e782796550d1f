//! `colocated-faultproxy`: the fault proxy as a process, for tests in other
//! languages than Rust.
//!
//! `colocated-faultproxy --upstream 127.0.0.1:PORT` prints
//! `listening 127.0.0.1:PORT` (its own address) as its first line of
//! stdout, then reads one command per line of stdin and answers each with
//! one line: `ok`, a JSON object for `stats`, or `error: WHY`.
//!
//! - `latency up|down|both MS`: added delay of each chunk, in milliseconds;
//! - `partition on|off`: stop forwarding (sockets stay open) or heal;
//! - `reset`: reset every open connection on both sides;
//! - `bandwidth up|down|both BYTES_PER_S|off`: a limit per connection;
//! - `refuse on|off`: reset new connections at once, or forward them again;
//! - `stats`: `{"accepted":N,"refused":N,"open":N,"bytes_up":N,"bytes_down":N}`;
//! - `quit`: answers `ok` and exits.
//!
//! It exits (closing every connection) when stdin closes.

use std::io::{self, BufRead, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use colocated_faultproxy::{Direction, FaultProxy};

/// A fault-injecting TCP proxy on 127.0.0.1, driven over stdin.
#[derive(Parser)]
#[command(name = "colocated-faultproxy", version)]
struct Args {
    /// The address every accepted connection is forwarded to.
    #[arg(long)]
    upstream: SocketAddr,
}

/// What a command line asks for.
enum Command {
    /// Change the faults, or do nothing (answers `ok`).
    Apply(Box<dyn FnOnce(&FaultProxy)>),
    /// Answer the counters.
    Stats,
    /// Answer `ok` and exit.
    Quit,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let proxy = match FaultProxy::start(args.upstream) {
        Ok(proxy) => proxy,
        Err(e) => {
            eprintln!("colocated-faultproxy: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = io::stdout().lock();
    if writeln!(out, "listening {}", proxy.addr())
        .and_then(|()| out.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let (answer, quit) = match parse(&line) {
            Ok(Command::Apply(apply)) => {
                apply(&proxy);
                ("ok".to_string(), false)
            }
            Ok(Command::Stats) => (proxy.stats().to_json(), false),
            Ok(Command::Quit) => ("ok".to_string(), true),
            Err(why) => (format!("error: {why}"), false),
        };
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
            || quit
        {
            break;
        }
    }
    proxy.stop();
    ExitCode::SUCCESS
}

/// The command of one line of stdin, or why it is not one.
fn parse(line: &str) -> Result<Command, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let command = match words.as_slice() {
        ["latency", direction, ms] => {
            let direction = parse_direction(direction)?;
            let ms: u64 = ms
                .parse()
                .map_err(|_| format!("latency takes whole milliseconds, not {ms:?}"))?;
            apply(move |p| p.set_latency(direction, Duration::from_millis(ms)))
        }
        ["partition", on] => {
            let on = parse_switch(on)?;
            apply(move |p| p.partition(on))
        }
        ["reset"] => apply(FaultProxy::reset),
        ["bandwidth", direction, rate] => {
            let direction = parse_direction(direction)?;
            let rate = match *rate {
                "off" => None,
                rate => match rate.parse::<u64>() {
                    Ok(rate) if rate > 0 => Some(rate),
                    _ => {
                        return Err(format!(
                            "bandwidth takes bytes per second (above 0) or off, not {rate:?}"
                        ))
                    }
                },
            };
            apply(move |p| p.set_bandwidth(direction, rate))
        }
        ["refuse", on] => {
            let on = parse_switch(on)?;
            apply(move |p| p.refuse(on))
        }
        ["stats"] => Command::Stats,
        ["quit"] => Command::Quit,
        [] => return Err("empty command".into()),
        [name, ..] => {
            return Err(format!(
                "unknown command or arguments {name:?}: expected latency, partition, reset, \
                 bandwidth, refuse, stats or quit"
            ))
        }
    };
    Ok(command)
}

fn apply(change: impl FnOnce(&FaultProxy) + 'static) -> Command {
    Command::Apply(Box::new(change))
}

fn parse_direction(word: &str) -> Result<Direction, String> {
    match word {
        "up" => Ok(Direction::Up),
        "down" => Ok(Direction::Down),
        "both" => Ok(Direction::Both),
        _ => Err(format!("a direction is up, down or both, not {word:?}")),
    }
}

fn parse_switch(word: &str) -> Result<bool, String> {
    match word {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not {word:?}")),
    }
}
