// colocatedClass(Class): objects that live on the hosts of their methods'
// arguments, on this process's devices and on Node workers.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const c = require('..')
const { collectUntil, startWorker, tokenFile, TMP } = require('./helpers.js')

c.configure({ numCpuDevices: 2 })

// Host code shares state with the test through the global object (local host).
globalThis.built = 0
globalThis.disposed = 0

class Accumulator {
  constructor(start) {
    globalThis.built = (globalThis.built ?? 0) + 1
    this.total = start
  }
  async add(x) {
    const data = await x.toTypedArray()
    this.total += data.reduce((a, b) => a + b, 0)
    return colocated.devicePut(
      data.map(() => this.total),
      x.sharding,
    )
  }
  [Symbol.dispose]() {
    globalThis.disposed = (globalThis.disposed ?? 0) + 1
  }
}

test('an object is built once on its host, keeps its state across calls, and is destroyed on dispose', async () => {
  globalThis.built = 0
  globalThis.disposed = 0
  const Remote = c.colocatedClass(Accumulator)
  const acc = new Remote(100)
  assert.equal(globalThis.built, 0) // lazily: nothing runs yet
  const x = c.devicePut(new Int32Array([1, 2]), c.devices()[0])
  assert.deepEqual(Array.from(await (await acc.add(x)).toTypedArray()), [103, 103])
  assert.deepEqual(Array.from(await (await acc.add(x)).toTypedArray()), [106, 106])
  assert.equal(globalThis.built, 1)
  // Another object is another host object.
  const other = new Remote(0)
  assert.deepEqual(Array.from(await (await other.add(x)).toTypedArray()), [3, 3])
  assert.equal(globalThis.built, 2)
  acc.dispose()
  const deadline = Date.now() + 2000
  while (globalThis.disposed < 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10))
  assert.equal(globalThis.disposed, 1)
  await assert.rejects(acc.add(x), (e) => e instanceof c.FailedPreconditionError && /disposed/.test(e.message))
  // The other object lives on.
  assert.deepEqual(Array.from(await (await other.add(x)).toTypedArray()), [6, 6])
  other.dispose()
})

test('objects live in core’s store and are freed with their wrapper', async () => {
  // Core's host-object store keeps each object (its token); this thread
  // keeps the JavaScript object until core drops the token, when the
  // wrapper is disposed or collected.
  class Freed {
    constructor(start) {
      this.start = start
    }
    add(x) {
      return colocated.devicePut([this.start + 1], x.sharding)
    }
    [Symbol.dispose]() {
      globalThis.freed = (globalThis.freed ?? 0) + 1
    }
  }
  globalThis.freed = 0
  // What earlier tests left goes first.
  await collectUntil(() => c._hosted().objects === 0, 2000)
  const before = c._hosted()
  const x = c.devicePut(new Int32Array([1]), c.devices()[0])
  // (In a function of its own: a frame that lives on would keep its last
  // values.)
  const during = await (async () => {
    const Remote = c.colocatedClass(Freed)
    const objects = [0, 1, 2, 3, 4].map((i) => new Remote(i))
    for (const [i, acc] of objects.entries()) {
      assert.deepEqual(Array.from(await (await acc.add(x)).toTypedArray()), [i + 1])
    }
    return c._hosted()
  })()
  assert.ok(during.objects >= before.objects + 5, JSON.stringify({ before, during }))
  assert.ok(during.values >= before.values + 5)
  // Not disposed: collected.
  await collectUntil(() => globalThis.freed >= 5 && c._hosted().objects <= before.objects)
  assert.equal(globalThis.freed, 5)
  const after = c._hosted()
  assert.ok(after.objects <= before.objects, JSON.stringify({ before, after }))
  assert.ok(after.values <= before.values)
})

test('a worker thread hosts the objects of the classes it defines', async () => {
  const { Worker } = require('node:worker_threads')
  const code = `
    const { parentPort, threadId } = require('node:worker_threads')
    const c = require(${JSON.stringify(path.join(__dirname, '..'))})
    const offset = 40
    // Its static part refers to a name around it: it does not travel by its
    // source, and only this thread can build its objects.
    class Here {
      static offset = offset
      async where(x) {
        const [v] = await x.toTypedArray()
        return c.devicePut(new Int32Array([v + Here.offset, threadId]), c.devices()[0])
      }
    }
    const here = new (c.colocatedClass(Here))()
    ;(async () => {
      const x = c.devicePut(new Int32Array([2]), c.devices()[0])
      const [sum, ran] = await (await here.where(x)).toTypedArray()
      parentPort.postMessage({ sum, ran })
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
  assert.deepEqual(answer, { sum: 42, ran: thread })
})

test('dispose() right after calls still waiting to be submitted lets them run first', async () => {
  const Remote = c.colocatedClass(Accumulator)
  const acc = new Remote(0)
  const x = c.devicePut(new Int32Array([1]), c.devices()[0])
  // The first call discovers (off the event loop); the second waits behind it.
  const first = acc.add(x)
  const second = acc.add(x)
  acc.dispose()
  assert.deepEqual(Array.from(await (await first).toTypedArray()), [1])
  assert.deepEqual(Array.from(await (await second).toTypedArray()), [2])
  await assert.rejects(acc.add(x), (e) => e instanceof c.FailedPreconditionError && /disposed/.test(e.message))
})

test('a constructor’s error is thrown again by every call, and the constructor runs once', async () => {
  globalThis.attempts = 0
  class Broken {
    constructor() {
      globalThis.attempts++
      throw new Error('cannot build')
    }
    use(x) {
      return x
    }
  }
  const b = new (c.colocatedClass(Broken))()
  const x = c.devicePut([1], c.devices()[1])
  for (let i = 0; i < 2; i++) {
    await assert.rejects(
      b.use(x),
      (e) => e instanceof c.InternalError && /cannot build/.test(e.message) && /Broken/.test(e.remoteStack),
    )
  }
  assert.equal(globalThis.attempts, 1)
  assert.throws(() => c.colocatedClass(3), c.InvalidArgumentError)
})

test('on Node workers: one object per host, destroyed there when disposed', async () => {
  const token = tokenFile()
  const workers = await Promise.all([0, 1].map(() => startWorker({ devices: 1, token, node: true })))
  try {
    const client = await c.connect(
      workers.map((w) => w.address),
      { tokenFile: token.file, default: false },
    )
    const dir = fs.mkdtempSync(path.join(TMP, 'disposed-'))
    // Each host's object counts its calls and, when destroyed, leaves a file
    // named by its pid.
    class Counter {
      constructor(dir) {
        this.dir = dir
        this.calls = 0
      }
      async tick(x) {
        this.calls++
        const data = await x.toTypedArray()
        return colocated.devicePut(
          data.map(() => this.calls * 1e6 + process.pid),
          x.sharding,
        )
      }
      [Symbol.dispose]() {
        require('node:fs').writeFileSync(`${this.dir}/${process.pid}`, String(this.calls))
      }
    }
    const counter = new (c.colocatedClass(Counter))(dir)
    const sharding = new c.NamedSharding(new c.Mesh(client.devices(), ['x']), c.P('x'))
    const x = c.devicePut(new Int32Array([0, 0]), sharding)
    await counter.tick(x)
    const second = Array.from(await (await counter.tick(x)).toTypedArray())
    assert.deepEqual(
      second,
      workers.map((w) => 2e6 + w.pid),
    )
    // A class that refers to names around it cannot travel to a worker.
    const outer = 5
    class Captures {
      static base = outer
      get(v) {
        return v
      }
    }
    const captures = new (c.colocatedClass(Captures))()
    await assert.rejects(
      captures.get(x),
      (e) => e instanceof c.InvalidArgumentError && /not self-contained/.test(e.message),
    )
    counter.dispose()
    const files = () => fs.readdirSync(dir).sort()
    const deadline = Date.now() + 5000
    while (files().length < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20))
    assert.deepEqual(files(), workers.map((w) => String(w.pid)).sort())
    for (const w of workers) assert.equal(fs.readFileSync(path.join(dir, String(w.pid)), 'utf8'), '2')
    client.close()
  } finally {
    await Promise.all(workers.map((w) => w.stop()))
  }
})
