// The cases every SDK answers alike (tests/cases/colocated.json): the same
// calls of colocated functions give the same outputs, shardings, errors and
// cache counts in Node, Python and C, because core decides them. This is
// Node's runner; Python's is sdk-python/tests/test_shared_cases.py, C's
// tests/c/test_shared_cases.c.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const c = require('..')
const { collectUntil } = require('./helpers.js')

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

const TYPED = { float32: Float32Array, int32: Int32Array }

function shardingOf(arg) {
  const devices = arg.devices.map((i) => c.devices()[i])
  const options = { memoryKind: arg.memory_kind }
  if (devices.length === 1) return new c.SingleDeviceSharding(devices[0], options)
  return new c.NamedSharding(new c.Mesh(devices, ['x']), arg.split ? c.P('x') : c.P(), options)
}

const argument = (arg) => c.devicePut(TYPED[arg.dtype].from(arg.values), shardingOf(arg))

async function checkOutput(out, want, where) {
  assert.equal(out.dtype, want.dtype, where)
  assert.deepEqual(Array.from(await out.toTypedArray()), want.values, where)
  const sharding = out.sharding
  const devices = sharding.devices ?? [sharding.device]
  assert.deepEqual(
    devices.map((d) => d.id),
    want.devices.map((i) => c.devices()[i].id),
    where,
  )
  const split = devices.length > 1 && !sharding.isFullyReplicated
  assert.equal(split, want.split, where)
  assert.equal(sharding.memoryKind, want.memory_kind ?? 'device', where)
}

/** Makes the case's function (a method of a new object for a method) and makes its calls. */
async function runCalls(testCase) {
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
    let args = call.args.map(argument)
    if (call.tree) args = [Object.fromEntries(Object.entries(call.tree).map(([key, i]) => [key, args[i]]))]
    if (call.error) {
      await assert.rejects(
        fn(...args),
        (e) => e instanceof ERRORS[call.error.code] && e.message.includes(call.error.fragment),
        where,
      )
    } else {
      const result = await fn(...args)
      const outputs = Array.isArray(result) ? result : [result]
      assert.equal(outputs.length, call.outputs.length, where)
      for (const [i, out] of outputs.entries()) await checkOutput(out, call.outputs[i], `${where}, output ${i}`)
    }
    if (call.cache) {
      const { hits, misses } = fn.cacheInfo()
      assert.deepEqual({ hits, misses }, call.cache, where)
    }
  }
}

for (const testCase of TABLE.cases) {
  test(testCase.name, async () => {
    assert.ok(c.devices().length >= TABLE.devices)
    globalThis.sharedCasesFreed = 0
    const objectsBefore = c._hosted().objects
    // (Its frame goes when it returns, and the wrapper with it.)
    await runCalls(testCase)
    if (testCase.freed !== undefined) {
      await collectUntil(() => globalThis.sharedCasesFreed >= testCase.freed && c._hosted().objects <= objectsBefore)
      assert.equal(globalThis.sharedCasesFreed, testCase.freed)
      assert.equal(c._hosted().objects, objectsBefore)
    }
  })
}
