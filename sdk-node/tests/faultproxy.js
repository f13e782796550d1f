// The test suite's fault-injecting TCP proxy as a process: `colocated-faultproxy`
// (the Rust crate tests/faultproxy), built by `cargo build -p colocated-faultproxy`
// into the workspace's target folder (`make test-node` builds it).
//
// `await FaultProxy.start(upstream)` listens on a free port of 127.0.0.1
// (`address`) and forwards every connection to `upstream`; its methods set
// faults for the connections open and to come. `skipReason()` says why the
// tests that need it cannot run (the binary is missing), or null; in CI (the
// `CI` variable set) it is null and `start` fails instead.

const { spawn } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')
const readline = require('node:readline')

const ROOT = path.join(__dirname, '..', '..')

/** Milliseconds the proxy has to start, answer a command, or exit once told. */
const TIMEOUT_MS = 30000

/**
 * Where the binary is: `debug/colocated-faultproxy` in `CARGO_TARGET_DIR`
 * (relative to the workspace root when relative), else in `target/`.
 */
function binaryPath() {
  return path.resolve(ROOT, process.env.CARGO_TARGET_DIR || 'target', 'debug', 'colocated-faultproxy')
}

/** Why the binary cannot run (it is not built), or null if it can. */
function missingReason() {
  const bin = binaryPath()
  try {
    fs.accessSync(bin, fs.constants.X_OK)
    return null
  } catch {
    return `the fault proxy is not built (${bin}): run \`cargo build -p colocated-faultproxy\``
  }
}

/**
 * The reason to skip a test that needs the proxy (`test(name, { skip }, …)`),
 * or null: null too in CI, where `FaultProxy.start` then fails with the reason.
 */
function skipReason() {
  return process.env.CI ? null : missingReason()
}

/**
 * One `colocated-faultproxy` process forwarding `127.0.0.1:PORT` (`address`)
 * to `upstream` (`HOST:PORT`). Each method sends one command and resolves
 * once the proxy has applied it; a command the proxy refuses rejects with its
 * answer. Directions are `'up'` (client to upstream), `'down'` or `'both'`.
 * Call `close()` when done.
 */
class FaultProxy {
  /** Starts a proxy in front of `upstream`; resolves once it listens. */
  static async start(upstream) {
    const missing = missingReason()
    if (missing !== null) throw new Error(missing)
    const proxy = new FaultProxy(upstream)
    const line = await proxy._readLine().catch(async (error) => {
      await proxy.close()
      throw error
    })
    if (!line.startsWith('listening ')) {
      await proxy.close()
      throw new Error(`the fault proxy did not start: ${JSON.stringify(line)}`)
    }
    proxy.address = line.split(' ').at(-1)
    return proxy
  }

  /** Use `FaultProxy.start`. */
  constructor(upstream) {
    this.child = spawn(binaryPath(), ['--upstream', upstream], { stdio: ['pipe', 'pipe', 'inherit'] })
    this.exited = new Promise((resolve) => this.child.once('close', resolve))
    // Lines not yet read, and the readers waiting for one.
    this.lines = []
    this.waiting = []
    const end = () => {
      for (const { reject } of this.waiting.splice(0)) reject(new Error('the fault proxy exited'))
    }
    this.child.once('error', end)
    // Writes to a proxy that exited fail its next read instead.
    this.child.stdin.on('error', () => {})
    const input = readline.createInterface({ input: this.child.stdout })
    input.on('line', (line) => {
      const reader = this.waiting.shift()
      if (reader) reader.resolve(line)
      else this.lines.push(line)
    })
    input.once('close', end)
  }

  /** The next line of stdout, within TIMEOUT_MS (a silent proxy fails the test instead of hanging it). */
  _readLine() {
    if (this.lines.length > 0) return Promise.resolve(this.lines.shift())
    if (this.child.exitCode !== null || this.child.signalCode !== null) {
      return Promise.reject(new Error('the fault proxy exited'))
    }
    return new Promise((resolve, reject) => {
      const reader = {
        resolve: (line) => {
          clearTimeout(timer)
          resolve(line)
        },
        reject: (error) => {
          clearTimeout(timer)
          reject(error)
        },
      }
      const timer = setTimeout(() => {
        this.waiting.splice(this.waiting.indexOf(reader), 1)
        reject(new Error(`the fault proxy did not answer within ${TIMEOUT_MS} ms`))
      }, TIMEOUT_MS)
      this.waiting.push(reader)
    })
  }

  /** Sends `command` and resolves with the proxy's answer (rejects with an `error: …` one). */
  async _ask(command) {
    this.child.stdin.write(`${command}\n`)
    const answer = await this._readLine()
    if (answer.startsWith('error: ')) throw new Error(`${JSON.stringify(command)}: ${answer}`)
    return answer
  }

  /** Delivers each chunk `ms` milliseconds after it was read (0: no delay). */
  async latency(ms, direction = 'both') {
    await this._ask(`latency ${direction} ${Math.trunc(ms)}`)
  }

  /**
   * Stops forwarding in both directions, every socket kept open, and holds
   * the data (`on`); delivers it all after the heal (`false`).
   */
  async partition(on = true) {
    await this._ask(`partition ${on ? 'on' : 'off'}`)
  }

  /** Resets every open connection on both sides (ECONNRESET); new connections work. */
  async reset() {
    await this._ask('reset')
  }

  /** Limits each connection to `bytesPerSecond` (null: unlimited). */
  async bandwidth(bytesPerSecond, direction = 'both') {
    await this._ask(`bandwidth ${direction} ${bytesPerSecond === null ? 'off' : Math.trunc(bytesPerSecond)}`)
  }

  /** Resets new connections at once (`on`), as a port whose worker is down; forwards them again with `false`. */
  async refuse(on = true) {
    await this._ask(`refuse ${on ? 'on' : 'off'}`)
  }

  /** The counters: `accepted`, `refused`, `open`, `bytes_up` and `bytes_down`. */
  async stats() {
    return JSON.parse(await this._ask('stats'))
  }

  /** Stops the proxy (closing its connections) and waits for it to exit. */
  async close() {
    // The proxy exits when its stdin closes.
    this.child.stdin.end()
    const timer = setTimeout(() => this.child.kill('SIGKILL'), TIMEOUT_MS)
    await this.exited
    clearTimeout(timer)
  }
}

module.exports = { FaultProxy, binaryPath, skipReason }
