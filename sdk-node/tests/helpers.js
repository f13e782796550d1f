// Real worker processes (the `colocated worker` executable) on 127.0.0.1 for
// the tests, with the test plugin (`tests/plugin/add_one_plugin.c`) loaded.

const { spawn, execFileSync } = require('node:child_process')
const crypto = require('node:crypto')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')

const ROOT = path.join(__dirname, '..', '..')
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'colocated-node-'))

/** The worker executable (built by `make node-test`'s dependencies). */
function workerBin() {
  return process.env.COLOCATED_WORKER_BIN ?? path.join(ROOT, 'target', 'debug', 'colocated')
}

/** The Python of the Python SDK's venv (`make python`), or null without it. */
function pythonBin() {
  const bin = process.env.COLOCATED_PYTHON ?? path.join(ROOT, 'build', 'venv', 'bin', 'python')
  return fs.existsSync(bin) ? bin : null
}

let plugin
/** The test plugin, compiled once per test file. */
function pluginPath() {
  if (plugin === undefined) {
    plugin = path.join(TMP, 'libadd_one_plugin.so')
    const source = path.join(ROOT, 'tests', 'plugin', 'add_one_plugin.c')
    const include = path.join(ROOT, 'include')
    execFileSync(process.env.CC ?? 'cc', ['-std=c11', '-shared', '-fPIC', '-I', include, source, '-o', plugin])
  }
  return plugin
}

/** A fresh token in a file only this user reads: `{token, file}`. */
function tokenFile() {
  const token = crypto.randomBytes(24).toString('hex')
  const file = path.join(TMP, `token-${crypto.randomBytes(4).toString('hex')}`)
  fs.writeFileSync(file, token, { mode: 0o600 })
  return { token, file }
}

/**
 * Starts a worker with `devices` CPU devices that accepts `token`'s file
 * (`colocated worker` with the test plugin; with `node`, this package's
 * `colocated worker`, which runs JavaScript too, serving every session in its
 * own process unless `isolated` (its default); with `python`, the Python
 * SDK's `python -m colocated.worker`, which isolates sessions);
 * listening on `listen`, with `env` added to its environment; resolves with
 * `{address, pid, kill(signal), stop()}` once it prints its
 * `listening on HOST:PORT` line.
 */
function startWorker({
  devices = 1,
  token,
  python = false,
  node = false,
  isolated = false,
  listen = '127.0.0.1:0',
  extra = [],
  env: added = {},
}) {
  const args = ['--listen', listen, '--cpu-devices', String(devices), '--token-file', token.file, ...extra]
  // The test plugin checks that the loader refuses bad registrations; the
  // loader's warnings of those are expected.
  const env = { ...process.env, COLOCATED_LOG: 'warn,colocated_plugin=error', ...added }
  const stdio = ['pipe', 'pipe', 'inherit']
  const nodeBin = path.join(__dirname, '..', 'bin', 'colocated.js')
  let child
  if (python) child = spawn(pythonBin(), ['-m', 'colocated.worker', ...args], { stdio, env })
  else if (node) {
    const sessions = isolated ? [] : ['--shared-sessions']
    child = spawn(process.execPath, [nodeBin, 'worker', ...args, ...sessions, '--plugin', pluginPath()], { stdio, env })
  } else child = spawn(workerBin(), ['worker', ...args, '--plugin', pluginPath()], { stdio, env })
  return new Promise((resolve, reject) => {
    let out = ''
    const timer = setTimeout(() => reject(new Error(`worker did not start: ${out}`)), 20000)
    child.once('error', reject)
    child.once('exit', (code) => reject(new Error(`worker exited with ${code}: ${out}`)))
    const onData = (chunk) => {
      out += chunk
      const match = /^listening on (\S+)$/m.exec(out)
      if (!match) return
      // Once: later output (a Python worker's) must not start over.
      child.stdout.off('data', onData)
      child.stdout.resume()
      clearTimeout(timer)
      child.removeAllListeners('exit')
      const exited = new Promise((done) => child.once('exit', done))
      resolve({
        address: match[1],
        pid: child.pid,
        kill: (signal = 'SIGKILL') => {
          child.kill(signal)
          return exited
        },
        stop: () => {
          if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
          return exited
        },
      })
    }
    child.stdout.on('data', onData)
  })
}

/** Element values of every dtype, as a typed array or a JS array. */
const SAMPLES = {
  bool: [new Uint8Array([1, 0, 1, 1, 0, 0, 1, 0]), 'Uint8Array'],
  int8: [new Int8Array([-128, -1, 0, 1, 2, 3, 4, 127]), 'Int8Array'],
  uint8: [new Uint8Array([0, 1, 2, 3, 4, 5, 6, 255]), 'Uint8Array'],
  int16: [new Int16Array([-32768, -1, 0, 1, 2, 3, 4, 32767]), 'Int16Array'],
  uint16: [new Uint16Array([0, 1, 2, 3, 4, 5, 6, 65535]), 'Uint16Array'],
  int32: [new Int32Array([-(2 ** 31), -1, 0, 1, 2, 3, 4, 2 ** 31 - 1]), 'Int32Array'],
  uint32: [new Uint32Array([0, 1, 2, 3, 4, 5, 6, 2 ** 32 - 1]), 'Uint32Array'],
  int64: [new BigInt64Array([-(2n ** 63n), -1n, 0n, 1n, 2n, 3n, 4n, 2n ** 63n - 1n]), 'BigInt64Array'],
  uint64: [new BigUint64Array([0n, 1n, 2n, 3n, 4n, 5n, 6n, 2n ** 64n - 1n]), 'BigUint64Array'],
  // float16 and bfloat16 travel as their bits.
  float16: [new Uint16Array([0x3c00, 0x4000, 0xc000, 0, 0x7bff, 0x0001, 0x8000, 0x7c00]), 'Uint16Array'],
  bfloat16: [new Uint16Array([0x3f80, 0x4000, 0xc000, 0, 0x7f7f, 0x0001, 0x8000, 0x7f80]), 'Uint16Array'],
  float32: [new Float32Array([1.5, -2.25, 0, 3.4e38, -0, 1e-45, Number.POSITIVE_INFINITY, 7]), 'Float32Array'],
  float64: [new Float64Array([1.5, -2.25, 0, 1.7e308, -0, 5e-324, Number.NEGATIVE_INFINITY, 7]), 'Float64Array'],
  string: [['a', '', 'héllo', 'x'.repeat(1000), '日本', 'b', 'c', 'd'], 'Array'],
}

/** Runs the garbage collector (`--expose-gc` set from here: the test runner is not given it). */
const collectGarbage = (() => {
  require('node:v8').setFlagsFromString('--expose-gc')
  return require('node:vm').runInNewContext('gc')
})()

/**
 * Collects garbage until `done()` holds, for at most `ms` (finalizers, and
 * the releases they send, run on later turns).
 */
async function collectUntil(done, ms = 10000) {
  const deadline = Date.now() + ms
  while (!done() && Date.now() < deadline) {
    collectGarbage()
    await new Promise((r) => setTimeout(r, 10))
  }
}

module.exports = { collectUntil, startWorker, tokenFile, pluginPath, pythonBin, SAMPLES, ROOT, TMP }
