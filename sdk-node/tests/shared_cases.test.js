// The cases every SDK answers alike (tests/cases/colocated.json): the same
// calls of colocated functions give the same outputs, shardings, errors and
// cache counts in Node, Python and C, because core decides them. This is
// Node's runner; Python's is sdk-python/tests/test_shared_cases.py.

const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')
const c = require('..')

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

const TYPED = { float32: Float32Array, int32: Int32Array }

function shardingOf(ids, split) {
  const devices = ids.map((i) => c.devices()[i])
  if (devices.length === 1) return devices[0]
  return new c.NamedSharding(new c.Mesh(devices, ['x']), split ? c.P('x') : c.P())
}

const argument = (arg) => c.devicePut(TYPED[arg.dtype].from(arg.values), shardingOf(arg.devices, arg.split))

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
}

for (const testCase of TABLE.cases) {
  test(testCase.name, async () => {
    assert.ok(c.devices().length >= TABLE.devices)
    const fn = c.colocated(FUNCTIONS[testCase.function])
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
      const { hits, misses } = fn.cacheInfo()
      assert.deepEqual({ hits, misses }, call.cache, where)
    }
  })
}
