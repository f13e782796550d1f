// Benchmarks of the Node SDK, each printed beside a baseline measured in the
// same run (`make bench`): a local call against a napi no-op and a
// worker_threads round trip; a call to a worker against a raw `net`
// ping-pong between two Node processes; a 256 MiB devicePut to a worker
// against raw `net` throughput, and the event loop's stall during a 64 MiB
// one against copying the data; pipelined calls.
import { fork, spawn } from 'node:child_process'
import crypto from 'node:crypto'
import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { Worker } from 'node:worker_threads'
import binding from '../binding.js'
import * as c from '../index.mjs'

const ROOT = path.join(import.meta.dirname ?? path.dirname(new URL(import.meta.url).pathname), '..', '..')
const WORKER_BIN = process.env.COLOCATED_WORKER_BIN ?? path.join(ROOT, 'target', 'debug', 'colocated')
const PLUGIN = process.env.COLOCATED_PLUGIN ?? path.join(ROOT, 'build', 'libadd_one_plugin.so')
const BULK = 256 << 20

/** Median seconds per call of `f` (awaited), over `runs` batches of `n`. */
async function perCall(f, n, runs = 7) {
  await f()
  const times = []
  for (let r = 0; r < runs; r++) {
    const start = process.hrtime.bigint()
    for (let i = 0; i < n; i++) await f()
    times.push(Number(process.hrtime.bigint() - start) / 1e9 / n)
  }
  times.sort((a, b) => a - b)
  return times[times.length >> 1]
}

const us = (s) => `${(s * 1e6).toFixed(2)} µs`
const rows = []
function row(measure, figure, baseline, ratio) {
  rows.push([measure, figure, baseline, ratio])
}

// A child Node process: echoes single bytes, or swallows BULK bytes and answers one.
const SERVER = `
const net = require('node:net')
const server = net.createServer({ noDelay: true }, (socket) => {
  let mode = null, got = 0
  socket.on('data', (chunk) => {
    if (mode === null) mode = chunk[0] === 0x42 ? 'bulk' : 'echo'
    if (mode === 'echo') return socket.write(chunk)
    got += chunk.length
    if (got >= ${BULK}) { got = 0; mode = null; socket.write(Buffer.from([1])) }
  })
})
server.listen(0, '127.0.0.1', () => process.send(server.address().port))
`

async function rawNet() {
  const file = path.join(os.tmpdir(), `colocated-bench-${process.pid}.cjs`)
  fs.writeFileSync(file, SERVER)
  const child = fork(file, [], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] })
  const port = await new Promise((resolve) => child.once('message', resolve))
  const connect = () =>
    new Promise((resolve) => {
      const s = net.connect({ port, host: '127.0.0.1', noDelay: true }, () => resolve(s))
    })
  const ping = await connect()
  const pingPong = await perCall(
    () =>
      new Promise((resolve) => {
        ping.once('data', resolve)
        ping.write(Buffer.from([1]))
      }),
    2000,
  )
  ping.destroy()
  const bulk = await connect()
  const data = Buffer.alloc(BULK, 0x42)
  const throughput = await perCall(
    () =>
      new Promise((resolve) => {
        bulk.once('data', resolve)
        bulk.write(data)
      }),
    1,
    5,
  )
  bulk.destroy()
  child.kill()
  fs.rmSync(file)
  return { pingPong, throughput: BULK / throughput }
}

async function startWorker(tokenFile) {
  const args = [
    'worker',
    '--listen',
    '127.0.0.1:0',
    '--cpu-devices',
    '1',
    '--token-file',
    tokenFile,
    '--plugin',
    PLUGIN,
  ]
  const env = { ...process.env, COLOCATED_LOG: 'error' }
  const child = spawn(WORKER_BIN, args, { stdio: ['ignore', 'pipe', 'inherit'], env })
  const line = await new Promise((resolve) => child.stdout.once('data', resolve))
  return { child, address: /listening on (\S+)/.exec(String(line))[1] }
}

c.configure({ numCpuDevices: 2 })
const local = c.client()
local.loadPlugin(PLUGIN)

// A napi no-op, and a worker_threads round trip.
const noop = await perCall(() => binding._noop(), 100000)
const thread = new Worker(
  'const { parentPort } = require("node:worker_threads"); parentPort.on("message", (m) => parentPort.postMessage(m))',
  { eval: true },
)
const postMessage = await perCall(
  () =>
    new Promise((resolve) => {
      thread.once('message', resolve)
      thread.postMessage(1)
    }),
  5000,
)
await thread.terminate()

// A local call: execute + await of a native program over one int32.
const device = local.devices()[0]
const spec = new c.ShapeDtypeStruct([1], 'int32', device)
const addOne = await c.compile({ language: 'native', payload: 'plugin_add_one_i32', inSpecs: [spec], outSpecs: [spec] })
const one = c.devicePut(new Int32Array([1]), device)
const localCall = await perCall(() => addOne.execute([one]).done, 5000)
row(
  'local call + await (native, 1 int32)',
  us(localCall),
  `napi no-op ${us(noop)}`,
  `${(localCall / noop).toFixed(1)}x`,
)
row('', '', `worker_threads postMessage ${us(postMessage)}`, `${(localCall / postMessage).toFixed(2)}x`)

// A local call of a JavaScript `x => x` (declared outputs: no discovery).
const identity = c.colocated((x) => x).specialize({ outSpecsFn: (spec) => spec })
const jsCall = await perCall(async () => (await identity(one)).ready(), 3000)
row('local JS call + await (x => x)', us(jsCall), `napi no-op ${us(noop)}`, `${(jsCall / noop).toFixed(1)}x`)
row('', '', `worker_threads postMessage ${us(postMessage)}`, `${(jsCall / postMessage).toFixed(2)}x`)

// Pipelined: 1000 calls queued without waiting (program order), then the
// last one awaited.
const pipelined = (exe, x) =>
  perCall(async () => {
    let run
    for (let i = 0; i < 1000; i++) run = exe.execute([x])
    await run.done
  }, 1)
const localPipelined = await pipelined(addOne, one)
row('pipelined local calls', `${(1 / localPipelined).toFixed(0)} k/s`, '', '')

// Remote: a worker process on loopback.
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'colocated-bench-'))
const tokenFile = path.join(dir, 'token')
fs.writeFileSync(tokenFile, crypto.randomBytes(24).toString('hex'), { mode: 0o600 })
const worker = await startWorker(tokenFile)
const remote = await c.connect(worker.address, { tokenFile, default: false })
const onWorker = remote.devices()[0]
const remoteSpec = new c.ShapeDtypeStruct([1], 'int32', onWorker)
const remoteAddOne = await c.compile({
  language: 'native',
  payload: 'plugin_add_one_i32',
  inSpecs: [remoteSpec],
  outSpecs: [remoteSpec],
})
const remoteOne = c.devicePut(new Int32Array([1]), onWorker)
await remoteOne.ready()
const raw = await rawNet()
const remoteCall = await perCall(() => remoteAddOne.execute([remoteOne]).done, 1000)
row(
  'remote call + await',
  us(remoteCall),
  `raw net ping-pong ${us(raw.pingPong)}`,
  `${(remoteCall / raw.pingPong).toFixed(2)}x (target <= 3x)`,
)
const remotePipelined = await pipelined(remoteAddOne, remoteOne)
row('pipelined remote calls', `${(1 / remotePipelined).toFixed(0)} k/s`, '', '')

const data = new Float32Array(BULK / 4)
const put = await perCall(
  async () => {
    const x = c.devicePut(data, onWorker)
    await x.ready()
    x.delete()
  },
  1,
  5,
)
const gbs = (bytesPerSecond) => `${(bytesPerSecond / 1e9).toFixed(2)} GB/s`
row(
  'devicePut 256 MiB to a worker',
  gbs(BULK / put),
  `raw net ${gbs(raw.throughput)}`,
  `${((BULK / put / raw.throughput) * 100).toFixed(0)}% (target >= 70%)`,
)

// What a put costs the event loop: its longest stall (a 10 ms interval
// timer watching) during a 64 MiB devicePut to the worker, against the stall
// of copying the same bytes on the event loop.
async function longestStall(f) {
  let last = performance.now()
  let stall = 0
  const timer = setInterval(() => {
    const now = performance.now()
    stall = Math.max(stall, now - last)
    last = now
  }, 10)
  const pause = () => new Promise((resolve) => setTimeout(resolve, 50))
  await pause()
  const value = f()
  await pause()
  clearInterval(timer)
  return { value, stall }
}
const median = (xs) => xs.slice().sort((a, b) => a - b)[xs.length >> 1]
const small = new Float32Array(16 << 20)
const putStalls = []
const copyStalls = []
// The puts first: the copies' garbage would be collected during them.
for (let i = 0; i < 5; i++) {
  const { value, stall } = await longestStall(() => c.devicePut(small, onWorker))
  await value.ready()
  value.delete()
  putStalls.push(stall)
}
for (let i = 0; i < 5; i++) copyStalls.push((await longestStall(() => small.slice())).stall)
const ms = (x) => `${x.toFixed(1)} ms`
row(
  'devicePut 64 MiB: event-loop stall',
  ms(median(putStalls)),
  `copying it ${ms(median(copyStalls))}`,
  `${(median(putStalls) / median(copyStalls)).toFixed(2)}x (first put ${ms(putStalls[0])})`,
)

remote.close()
worker.child.kill('SIGTERM')
fs.rmSync(dir, { recursive: true })

console.log('== Node SDK (median) ==')
const widths = [38, 14, 34]
for (const [m, f, b, r] of [['measure', 'figure', 'baseline', 'ratio'], ...rows]) {
  console.log(`${m.padEnd(widths[0])}${f.padStart(widths[1])}   ${b.padEnd(widths[2])}${r}`)
}
