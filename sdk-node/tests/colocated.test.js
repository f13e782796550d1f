// colocated(fn): JavaScript functions on the hosts of their arguments, on this
// process's devices and on Node workers (real processes on 127.0.0.1).

const test = require('node:test')
const assert = require('node:assert/strict')
const c = require('..')
const { collectUntil, startWorker, tokenFile } = require('./helpers.js')

c.configure({ numCpuDevices: 4 })
const sharded = () => new c.NamedSharding(new c.Mesh(c.devices(), ['x']), c.P('x'))

// Host code shares state with the test through the global object (local
// host: same process).
globalThis.runs = 0

test('a function runs on the local host with its arrays; the first call discovers, later ones hit the cache', async () => {
  const addOne = c.colocated(async (x) => {
    globalThis.runs++
    const data = await x.toTypedArray()
    return colocated.devicePut(
      data.map((v) => v + 1),
      x.sharding,
    )
  })
  globalThis.runs = 0
  const x = c.devicePut(new Float32Array([0, 1, 2, 3, 4, 5, 6, 7]), sharded())
  const y = await addOne(x)
  assert.deepEqual(y.shape, [8])
  assert.equal(String(y.sharding), String(x.sharding))
  assert.deepEqual(Array.from(await y.toTypedArray()), [1, 2, 3, 4, 5, 6, 7, 8])
  assert.deepEqual(addOne.cacheInfo(), { hits: 0, misses: 1, currsize: 1 })
  // Queued back to back: program order chains them.
  const calls = [addOne(y), addOne(y)]
  const [a, b] = await Promise.all(calls)
  assert.deepEqual(Array.from(await b.toTypedArray()), [2, 3, 4, 5, 6, 7, 8, 9])
  assert.deepEqual(Array.from(await a.toTypedArray()), [2, 3, 4, 5, 6, 7, 8, 9])
  assert.deepEqual(addOne.cacheInfo(), { hits: 2, misses: 1, currsize: 1 })
  assert.equal(globalThis.runs, 3)
})

test('results are trees of arrays; declared outputs need no discovery run', async () => {
  const x = c.devicePut(new Int32Array([1, 2, 3, 4]), sharded())
  const tree = c.colocated((a, b) => ({ first: a, both: [a, b], none: null }))
  const out = await tree(x, x)
  assert.deepEqual(Object.keys(out), ['first', 'both', 'none'])
  assert.equal(out.both.length, 2)
  assert.equal(out.none, null)
  assert.deepEqual(Array.from(await out.both[1].toTypedArray()), [1, 2, 3, 4])

  globalThis.runs = 0
  const declared = c
    .colocated((v) => {
      globalThis.runs++
      return v
    })
    .specialize({ outSpecsFn: (spec) => spec })
  const y = await declared(x)
  // Returned before the function ran (no discovery), ready later.
  await y.ready()
  assert.equal(globalThis.runs, 1)
  assert.deepEqual(Array.from(await y.toTypedArray()), [1, 2, 3, 4])
  assert.throws(() => declared.specialize({ outSpecsFn: (s) => s }), c.InvalidArgumentError)
})

test('every call must return the first call’s structure; an object’s key order is not its structure', async () => {
  const x = c.devicePut(new Int32Array([0, 1, 2, 3]), sharded())
  // Built in another key order once the first call discovered {a, b}.
  globalThis.keyed = 0
  const keyed = c.colocated((v) => (globalThis.keyed++ === 0 ? { a: v, b: v } : { b: v, a: v }))
  await keyed(x)
  const again = await keyed(x)
  await c.blockUntilReady(again)
  assert.deepEqual(Array.from(await again.a.toTypedArray()), [0, 1, 2, 3])
  // Another structure with as many arrays is refused on its host.
  globalThis.shapes = 0
  const shifty = c.colocated((v) => (globalThis.shapes++ === 0 ? { a: v } : [v]))
  await shifty(x)
  await assert.rejects(
    async () => c.blockUntilReady(await shifty(x)),
    (e) => e instanceof c.InvalidArgumentError && e.message.includes("another structure than its program's"),
  )
})

test('a function without arguments runs on the devices it is specialized with', async () => {
  const device = c.devices()[2]
  const make = c
    .colocated(() => colocated.devicePut([7, 8], colocated.devices()[2], { dtype: 'int32' }))
    .specialize({ devices: [device] })
  const out = await make()
  assert.equal(out.sharding.device.id, 2)
  assert.deepEqual(Array.from(await out.toTypedArray()), [7, 8])
  await assert.rejects(
    c.colocated(() => null)(),
    (e) => e instanceof c.InvalidArgumentError && /must be first specialized with devices/.test(e.message),
  )
})

test('errors: the function’s own, with its stack; bad arguments and results', async () => {
  const x = c.devicePut([1, 2], c.devices()[0])
  const fails = c.colocated(function failing() {
    throw new Error('boom')
  })
  await assert.rejects(
    fails(x),
    (e) => e instanceof c.InternalError && /boom/.test(e.message) && /failing/.test(e.remoteStack),
  )
  const typed = c.colocated(() => {
    throw new colocated.NotFoundError('no such thing')
  })
  await assert.rejects(typed(x), (e) => e instanceof c.NotFoundError && /no such thing/.test(e.message))
  await assert.rejects(
    c.colocated(() => 42)(x),
    (e) => e instanceof c.InvalidArgumentError && /results are arrays/.test(e.message),
  )
  await assert.rejects(c.colocated((v) => v)(x, 3), c.InvalidArgumentError)
  // Host code may call colocated functions: the nested call runs on a
  // stream of its own, never behind the program that makes it.
  const inner = c.colocated((v) => v)
  globalThis.inner = inner
  const nested = await c.colocated((v) => globalThis.inner(v))(x)
  assert.deepEqual(Array.from(await nested.toTypedArray()), Array.from(await x.toTypedArray()))
  assert.throws(() => c.colocated(42), c.InvalidArgumentError)
})

test('on Node workers: once per host with its shards, outputs assembled', async () => {
  const token = tokenFile()
  const workers = await Promise.all([0, 1, 2].map(() => startWorker({ devices: 2, token, node: true })))
  try {
    const client = await c.connect(
      workers.map((w) => w.address),
      { tokenFile: token.file, default: false },
    )
    const sharding = new c.NamedSharding(new c.Mesh(client.devices(), ['x']), c.P('x'))
    const x = c.devicePut(
      new Int32Array(12).map((_, i) => i),
      sharding,
    )
    // Each host: its block (4 of the 12), and the pid of the process that ran it.
    const where = c.colocated(async (v) => {
      const data = await v.toTypedArray()
      return {
        doubled: colocated.devicePut(
          data.map((n) => n * 2),
          v.sharding,
        ),
        pid: colocated.devicePut(
          data.map(() => process.pid),
          v.sharding,
        ),
        size: colocated.devicePut(
          data.map(() => data.length),
          v.sharding,
        ),
      }
    })
    const out = await where(x)
    assert.deepEqual(
      Array.from(await out.doubled.toTypedArray()),
      Array.from({ length: 12 }, (_, i) => i * 2),
    )
    assert.deepEqual(Array.from(await out.size.toTypedArray()), Array(12).fill(4))
    const pids = Array.from(await out.pid.toTypedArray())
    assert.deepEqual(
      [pids[0], pids[4], pids[8]],
      workers.map((w) => w.pid),
    )
    // The second call takes the compiled program.
    const again = await where(x)
    assert.deepEqual(Array.from(await again.doubled.toTypedArray()), Array.from(await out.doubled.toTypedArray()))
    assert.equal(where.cacheInfo().hits, 1)
    client.close()
  } finally {
    await Promise.all(workers.map((w) => w.stop()))
  }
})

test('inSpecs: every call must match them', async () => {
  const x = c.devicePut(new Int32Array([1, 2, 3, 4]), sharded())
  const spec = new c.ShapeDtypeStruct([4], 'int32', x.sharding)
  const f = c.colocated((v) => v).specialize({ inSpecs: [spec] })
  assert.deepEqual(Array.from(await (await f(x)).toTypedArray()), [1, 2, 3, 4])
  await assert.rejects(
    f(c.devicePut(new Float32Array(4), sharded())),
    (e) => e instanceof c.InvalidArgumentError && /in_specs/.test(e.message),
  )
  await assert.rejects(f(x, x), (e) => e instanceof c.InvalidArgumentError && /structure/.test(e.message))
  assert.throws(() => f.specialize({ inSpecs: [spec] }), c.InvalidArgumentError)
})

test('a module’s export travels as its specifier and name', async () => {
  const fs = require('node:fs')
  const path = require('node:path')
  const { pathToFileURL } = require('node:url')
  const { TMP } = require('./helpers.js')
  const file = path.join(TMP, 'triple.mjs')
  fs.writeFileSync(
    file,
    `import { devicePut } from ${JSON.stringify(pathToFileURL(path.join(__dirname, '..', 'index.mjs')).href)}
export async function triple(x) {
  return devicePut((await x.toTypedArray()).map((v) => v * 3), x.sharding)
}
`,
  )
  const triple = c.colocated({ module: pathToFileURL(file).href, export: 'triple' })
  const x = c.devicePut(new Int32Array([1, 2, 3, 4]), sharded())
  assert.deepEqual(Array.from(await (await triple(x)).toTypedArray()), [3, 6, 9, 12])
  await assert.rejects(c.colocated({ module: pathToFileURL(file).href, export: 'nope' })(x), c.InvalidArgumentError)
})

test('the event loop keeps turning while a long program runs', async () => {
  let ticks = 0
  const timer = setInterval(() => ticks++, 2)
  const long = c.colocated(async (v) => {
    await new Promise((resolve) => setTimeout(resolve, 200))
    return v
  })
  const x = c.devicePut(new Int32Array([1]), c.devices()[0])
  const before = ticks
  await (await long(x)).ready()
  clearInterval(timer)
  assert.ok(ticks - before > 10, `${ticks - before} ticks during a 200 ms program`)
})

test('streams: order within one, concurrency across them', async () => {
  const x = c.devicePut(new Int32Array([1]), c.devices()[0])
  const spec = (v) => v
  globalThis.events = []
  const slow = c
    .colocated(async (v) => {
      globalThis.events.push('slow start')
      await new Promise((resolve) => setTimeout(resolve, 300))
      globalThis.events.push('slow end')
      return v
    })
    .specialize({ outSpecsFn: spec })
  const fast = c
    .colocated((v) => {
      globalThis.events.push('fast')
      return v
    })
    .specialize({ outSpecsFn: spec })
  // Compiled once (declared outputs, no discovery runs), then measured.
  await (await slow(x)).ready()
  await (await fast(x)).ready()
  globalThis.events = []
  const client = c.client()
  const [a, b] = [client.createStream(), client.createStream()]
  assert.notEqual(a.id, b.id)
  // On one stream: the fast call waits for the slow one.
  const onA = await a.run(async () => [await slow(x), await fast(x)])
  await c.blockUntilReady(onA)
  assert.deepEqual(globalThis.events, ['slow start', 'slow end', 'fast'])
  // On two streams: the fast one runs while the slow one waits.
  globalThis.events = []
  const slowOnA = await a.run(() => slow(x))
  const fastOnB = await b.run(() => fast(x))
  await c.blockUntilReady([slowOnA, fastOnB])
  assert.deepEqual(globalThis.events, ['slow start', 'fast', 'slow end'])
})

test('specialized calls all return at once and run in program order', async () => {
  let open
  globalThis.gate = new Promise((resolve) => {
    open = resolve
  })
  globalThis.events = []
  const f = c
    .colocated(async (v) => {
      globalThis.events.push('start')
      await globalThis.gate
      globalThis.events.push('end')
      return v
    })
    .specialize({ outSpecsFn: (spec) => spec })
  const x = c.devicePut(new Int32Array([1]), c.devices()[0])
  // Three calls back to back: the first compiles, and none waits for the
  // function, which waits for the gate.
  const calls = [f(x), f(x), f(x)]
  const returned = await Promise.race([
    Promise.all(calls),
    new Promise((resolve) => setTimeout(() => resolve(null), 10000)),
  ])
  // The first runs; the others wait behind it.
  const deadline = Date.now() + 10000
  while (globalThis.events.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5))
  await new Promise((r) => setTimeout(r, 50))
  const started = globalThis.events.slice()
  open()
  assert.notEqual(returned, null, 'a call did not return while the first one ran')
  assert.deepEqual(started, ['start'])
  await c.blockUntilReady(returned)
  assert.deepEqual(globalThis.events, ['start', 'end', 'start', 'end', 'start', 'end'])
  assert.equal(f.cacheInfo().currsize, 1)
})

test('a call that compiles holds its place: a delete and an execute made after it wait for it', async () => {
  const device = c.devices()[0]
  const x = c.devicePut(new Int32Array([5]), device)
  const z = c.devicePut(new Int32Array([6]), device)
  await c.blockUntilReady([x, z])
  globalThis.events = []
  // A first call: it discovers its outputs on libuv's pool.
  const first = c.colocated(async (v) => {
    await new Promise((resolve) => setTimeout(resolve, 100))
    globalThis.events.push('colocated')
    return v
  })
  // A program made without colocated(): it logs when it runs.
  const spec = new c.ShapeDtypeStruct([1], 'int32', new c.SingleDeviceSharding(device))
  const logged = await c.compile({
    name: 'logged',
    language: 'node',
    payload: JSON.stringify({ source: "(v) => { globalThis.events.push('execute'); return v }", args: [0] }),
    inSpecs: [spec],
    outSpecs: [spec],
    devices: [device],
  })
  const y = first(x)
  x.delete()
  const run = logged.execute([z])
  await run.done
  assert.deepEqual(Array.from(await (await y).toTypedArray()), [5])
  assert.deepEqual(globalThis.events, ['colocated', 'execute'])
  assert.equal(x.isDeleted, true)
  await assert.rejects(first(x), c.FailedPreconditionError)
})

test('a worker thread hosts the functions it defines; the main thread hosts its own', async () => {
  const { Worker } = require('node:worker_threads')
  const where = c.colocated((x) =>
    colocated.devicePut(new Int32Array([require('node:worker_threads').threadId]), x.sharding),
  )
  const code = `
    const { parentPort } = require('node:worker_threads')
    const c = require(${JSON.stringify(require('node:path').join(__dirname, '..'))})
    const offset = 40
    // Travels as its source, and runs on this thread.
    const where = c.colocated((x) => colocated.devicePut(new Int32Array([require('node:worker_threads').threadId]), x.sharding))
    // Refers to a name around it and has no source of its own (bound):
    // only this thread can run it.
    const plus = c.colocated(async function (x) {
      const [v] = await x.toTypedArray()
      return c.devicePut(new Int32Array([v + offset]), x.sharding)
    }.bind(null))
    ;(async () => {
      const x = c.devicePut(new Int32Array([2]), c.devices()[0])
      const [ran] = await (await where(x)).toTypedArray()
      const [sum] = await (await plus(x)).toTypedArray()
      parentPort.postMessage({ ran, sum })
    })().catch((e) => parentPort.postMessage({ error: String(e) }))
  `
  const worker = new Worker(code, { eval: true })
  const thread = worker.threadId
  const answer = await new Promise((resolve, reject) => {
    worker.once('message', resolve)
    worker.once('error', reject)
  })
  await worker.terminate()
  assert.notEqual(thread, 0)
  assert.deepEqual(answer, { ran: thread, sum: 42 })
  // The main thread's functions still run here, also after that thread ended.
  const x = c.devicePut(new Int32Array([0]), c.devices()[0])
  assert.deepEqual(Array.from(await (await where(x)).toTypedArray()), [0])
})

test('a Node worker forgets the functions of programs it unloaded (a closed session’s)', async () => {
  const token = tokenFile()
  const [worker] = await Promise.all([startWorker({ devices: 1, token, node: true })])
  try {
    // What the worker hosts, asked by a program of a session of its own.
    const hosted = async () => {
      const client = await c.connect(worker.address, { tokenFile: token.file, default: false })
      const x = c.devicePut(new Int32Array([0]), client.devices()[0])
      const probe = c
        .colocated((v) => colocated.devicePut(new Int32Array([colocated._hosted().programs]), v.sharding))
        .specialize({ outSpecsFn: (v) => v })
      const [programs] = await (await probe(x)).toTypedArray()
      client.close()
      return programs
    }
    const before = await hosted()
    const client = await c.connect(worker.address, { tokenFile: token.file, default: false })
    const x = c.devicePut(new Int32Array([1]), client.devices()[0])
    for (let i = 0; i < 5; i++) {
      const f = c.colocated(new Function('v', `return v /* ${i} */`))
      await (await f(x)).ready()
    }
    client.close()
    // The session's programs go once the worker ended it.
    const deadline = Date.now() + 5000
    let after = await hosted()
    while (after > before && Date.now() < deadline) after = await hosted()
    assert.equal(after, before)
  } finally {
    await worker.stop()
  }
})

test('functions run by reference leave core’s registry with their colocated function', async () => {
  // This process's own functions run by reference through core's registry of
  // local values; making and dropping many does not grow it, or this
  // thread's table.
  await collectUntil(() => false, 200)
  const before = c._hosted()
  const x = c.devicePut(new Int32Array([1]), c.devices()[0])
  // (In a function of its own: a frame that lives on would keep its last
  // values.)
  const during = await (async () => {
    const offset = 3
    const made = []
    for (let i = 0; i < 50; i++) {
      // A method that uses `super` has no source that parses on its own,
      // and this one refers to a name around it: only this process can run it.
      const methods = {
        f(v) {
          return super.constructor === Object ? c.devicePut(new Int32Array([offset]), v.sharding) : null
        },
      }
      made.push(c.colocated(methods.f))
    }
    for (const f of made) assert.deepEqual(Array.from(await (await f(x)).toTypedArray()), [3])
    return c._hosted()
  })()
  assert.ok(during.registered >= before.registered + 50, JSON.stringify({ before, during }))
  assert.ok(during.values >= before.values + 50)
  const gone = () => {
    const now = c._hosted()
    return now.registered <= before.registered && now.values <= before.values && now.programs <= before.programs
  }
  await collectUntil(gone)
  const after = c._hosted()
  assert.equal(after.registered, before.registered, JSON.stringify({ before, after }))
  assert.equal(after.values, before.values)
  assert.equal(after.programs, before.programs)
})

test('a program naming a function of another process, a released one or none is refused with a typed error', async () => {
  const x = c.devicePut(new Int32Array([1]), c.devices()[0])
  const spec = new c.ShapeDtypeStruct([1], 'int32', c.devices()[0])
  // This process's token with a key it never gave out.
  const mine = new (require('../binding.js').LocalFunction)(0).reference.replace(/:\d+$/, ':0')
  const forged = [mine, 'colocated-local:0123456789abcdef:1', 'colocated-local:nonsense', 'not a reference', 7]
  for (const local of forged) {
    const payload = JSON.stringify({ local, args: [0] })
    const exe = await c.compile({ language: 'node', payload, inSpecs: [spec], outSpecs: [spec] })
    const run = exe.execute([x])
    await assert.rejects(run.done, (e) => e instanceof c.InvalidArgumentError && /not self-contained/.test(e.message))
  }
})
