// The cases every SDK answers alike (tests/cases/colocated.json): the same
// calls of colocated functions give the same outputs, shardings, errors and
// cache counts in Node, Python and C, because core decides them. This is
// Node's runner; Python's is sdk-python/tests/test_shared_cases.py, C's
// tests/c/test_shared_cases.c. Each case runs on a local client and on a
// client of a real worker process (this package's `colocated worker`), as the
// table's `runs` say; host code travels to the worker by its source.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const c = require('..')
const { collectUntil, startWorker, tokenFile } = require('./helpers.js')

const TABLE = JSON.parse(fs.readFileSync(path.join(__dirname, '..', '..', 'tests', 'cases', 'colocated.json'), 'utf8'))
c.configure({ numCpuDevices: TABLE.devices })

/** Error codes of the table -> this SDK's error classes. */
const ERRORS = {
  invalid_argument: c.InvalidArgumentError,
  failed_precondition: c.FailedPreconditionError,
  unimplemented: c.UnimplementedError,
}

const FUNCTIONS = {
  add_one: async (...xs) => {
    const out = await Promise.all(
      xs.map(async (x) =>
        colocated.devicePut(
          (await x.toTypedArray()).map((v) => v + 1),
          x.sharding,
        ),
      ),
    )
    return out.length === 1 ? out[0] : out
  },
  // (Self-contained, as host code travels by its source: add_one again.)
  reentrant: (...xs) =>
    colocated.colocated(async (...ys) => {
      const out = await Promise.all(
        ys.map(async (y) =>
          colocated.devicePut(
            (await y.toTypedArray()).map((v) => v + 1),
            y.sharding,
          ),
        ),
      )
      return out.length === 1 ? out[0] : out
    })(...xs),
  first: (...xs) => xs[0],
  a_of: (tree) => tree.a,
  restructures: async (x) => ((await x.toTypedArray())[0] === 0 ? x : [x]),
}

/** The table's methods of colocated classes, by name (host code counts destructions on the global object). */
const METHODS = {
  count: class Count {
    constructor() {
      this.calls = 0
    }
    async count(x) {
      this.calls++
      return colocated.devicePut(
        (await x.toTypedArray()).map((v) => v + this.calls),
        x.sharding,
      )
    }
    [Symbol.dispose]() {
      globalThis.sharedCasesFreed = (globalThis.sharedCasesFreed ?? 0) + 1
    }
  },
}

/** What this runner lacks, by run (the table's `needs`): nothing. */
const LACKS = {}

/**
 * The host's destructor count and the objects its store keeps, as an int32
 * array with `x`'s sharding: the runner reads a host's state through a
 * colocated call, so a worker's too.
 */
const hostState = (x) =>
  colocated.devicePut(Int32Array.from([globalThis.sharedCasesFreed ?? 0, colocated._hosted().objects]), x.sharding)

const TYPED = { float32: Float32Array, int32: Int32Array }

function shardingOf(arg, devices) {
  const ds = arg.devices.map((i) => devices[i])
  const options = { memoryKind: arg.memory_kind }
  if (ds.length === 1) return new c.SingleDeviceSharding(ds[0], options)
  return new c.NamedSharding(new c.Mesh(ds, ['x']), arg.split ? c.P('x') : c.P(), options)
}

const argument = (arg, devices) => c.devicePut(TYPED[arg.dtype].from(arg.values), shardingOf(arg, devices))

async function checkOutput(out, want, devices, where) {
  assert.equal(out.dtype, want.dtype, where)
  assert.deepEqual(Array.from(await out.toTypedArray()), want.values, where)
  const sharding = out.sharding
  const got = sharding.devices ?? [sharding.device]
  assert.deepEqual(
    got.map((d) => d.id),
    want.devices.map((i) => devices[i].id),
    where,
  )
  const split = got.length > 1 && !sharding.isFullyReplicated
  assert.equal(split, want.split, where)
  assert.equal(sharding.memoryKind, want.memory_kind ?? 'device', where)
}

/** Makes the case's function (a method of a new object for a method) and makes its calls. */
async function runCalls(testCase, devices) {
  const name = testCase.function
  let fn
  if (name in METHODS) {
    const object = new (c.colocatedClass(METHODS[name]))()
    fn = (...args) => object[name](...args)
  } else {
    fn = c.colocated(FUNCTIONS[name])
  }
  for (const [step, call] of testCase.calls.entries()) {
    const where = `call ${step}`
    let args = call.args.map((a) => argument(a, devices))
    if (call.tree) args = [Object.fromEntries(Object.entries(call.tree).map(([key, i]) => [key, args[i]]))]
    if (call.error?.at === 'run') {
      // The call returns; waiting for its outputs fails.
      const result = await fn(...args)
      await assert.rejects(
        c.blockUntilReady(result),
        (e) => e instanceof ERRORS[call.error.code] && e.message.includes(call.error.fragment),
        where,
      )
    } else if (call.error) {
      await assert.rejects(
        fn(...args),
        (e) => e instanceof ERRORS[call.error.code] && e.message.includes(call.error.fragment),
        where,
      )
    } else {
      const result = await fn(...args)
      const outputs = Array.isArray(result) ? result : [result]
      assert.equal(outputs.length, call.outputs.length, where)
      for (const [i, out] of outputs.entries())
        await checkOutput(out, call.outputs[i], devices, `${where}, output ${i}`)
    }
    if (call.cache) {
      const { hits, misses } = fn.cacheInfo()
      assert.deepEqual({ hits, misses }, call.cache, where)
    }
  }
}

/** Runs `testCase` on the client of `devices`. */
async function runCase(testCase, devices) {
  assert.ok(devices.length >= TABLE.devices)
  const probe = c.colocated(hostState)
  const probeArg = c.devicePut(new Int32Array(2), devices[0])
  const state = async () => Array.from(await (await probe(probeArg)).toTypedArray())
  const [freedBefore, objectsBefore] = await state()
  // (Its frame goes when it returns, and the wrapper with it.)
  await runCalls(testCase, devices)
  if (testCase.freed !== undefined) {
    let [freed, objects] = [freedBefore, objectsBefore]
    // (A colocated call per poll: collectUntil's predicate is synchronous.)
    const deadline = Date.now() + 10000
    while (Date.now() < deadline) {
      await collectUntil(() => false, 10)
      ;[freed, objects] = await state()
      if (freed - freedBefore >= testCase.freed && objects <= objectsBefore) break
    }
    assert.equal(freed - freedBefore, testCase.freed)
    assert.equal(objects, objectsBefore)
  }
}

/** The devices of a client connected to a real worker with the table's devices, started once. */
let remote
function remoteDevices() {
  remote ??= (async () => {
    const token = tokenFile()
    const worker = await startWorker({ devices: TABLE.devices, token, node: true })
    const client = await c.connect(worker.address, { tokenFile: token.file, default: false })
    assert.ok(
      client.devices().every((d) => d.processIndex === 1),
      "the worker's devices alone",
    )
    return { worker, client }
  })()
  return remote.then(({ client }) => client.devices())
}

test.after(async () => {
  if (remote === undefined) return
  const { worker, client } = await remote
  client.close()
  await worker.stop()
})

for (const run of TABLE.runs) {
  for (const testCase of TABLE.cases) {
    if (run !== 'local' && testCase.local_only) continue
    const lacking = (testCase.needs ?? []).filter((need) => LACKS[run]?.[need]).map((need) => LACKS[run][need])
    test(`${run}: ${testCase.name}`, { skip: lacking.length ? lacking.join('; ') : false }, async () => {
      const devices = run === 'local' ? c.devices() : await remoteDevices()
      await runCase(testCase, devices)
    })
  }
}
