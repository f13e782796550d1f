// The Node SDK on this process's own devices: arrays of every dtype, shardings,
// programs, errors, and an event loop that never waits.

const test = require('node:test')
const assert = require('node:assert/strict')
const c = require('..')
const { SAMPLES, pluginPath } = require('./helpers.js')

c.configure({ numCpuDevices: 4 })

test('configure before first use; devices and the default client', () => {
  const devices = c.devices()
  assert.equal(devices.length, 4)
  assert.deepEqual(
    devices.map((d) => d.id),
    [0, 1, 2, 3],
  )
  assert.equal(devices[0].kind, 'cpu')
  assert.equal(devices[0].processIndex, 0)
  assert.equal(String(devices[2]), 'CpuDevice(id=2)')
  assert.equal(c.localDevices().length, 4)
  assert.deepEqual(c.client().hosts(), [
    { index: 0, processIndex: 0, name: 'local', deviceIds: [0, 1, 2, 3], isRemote: false },
  ])
  // Too late now: the default client exists.
  assert.throws(
    () => c.configure({ numCpuDevices: 2 }),
    (e) => e instanceof c.FailedPreconditionError && e.code === 'failed_precondition' && /4 devices/.test(e.message),
  )
})

test('every dtype round-trips on one device and sharded over four', async () => {
  const mesh = new c.Mesh(c.devices(), ['x'])
  const sharded = new c.NamedSharding(mesh, c.P('x'))
  for (const [dtype, [values, kind]] of Object.entries(SAMPLES)) {
    for (const where of [c.devices()[1], sharded]) {
      const x = c.devicePut(values, where, { dtype })
      assert.equal(x.dtype, dtype)
      assert.deepEqual(x.shape, [8])
      const back = await x.toTypedArray()
      assert.equal(back.constructor.name, kind, dtype)
      assert.deepEqual(Array.from(back), Array.from(values), `${dtype} on ${where}`)
    }
  }
})

test('shards: their devices, indices and data', async () => {
  const mesh = new c.Mesh([c.devices().slice(0, 2), c.devices().slice(2, 4)], ['x', 'y'])
  assert.deepEqual(mesh.shape, [2, 2])
  const x = c.devicePut(
    new Int32Array(16).map((_, i) => i),
    new c.NamedSharding(mesh, c.P('x', 'y')),
    { shape: [4, 4] },
  )
  assert.equal(String(x.sharding), "NamedSharding(mesh=Mesh('x': 2, 'y': 2), spec=P('x', 'y'))")
  const shards = x.addressableShards
  assert.deepEqual(
    shards.map((s) => s.device.id),
    [0, 1, 2, 3],
  )
  assert.deepEqual(shards[1].index, [
    [0, 2],
    [2, 4],
  ])
  assert.deepEqual(Array.from(await shards[1].data.toTypedArray()), [2, 3, 6, 7])
  // Assembled again from its shards, without a copy.
  const y = c.makeArrayFromSingleDeviceArrays(
    [4, 4],
    x.sharding,
    shards.map((s) => s.data),
  )
  assert.deepEqual(Array.from(await y.toTypedArray()), Array.from(await x.toTypedArray()))
  // A replicated array: every device holds all of it.
  const r = c.devicePut([1.5, 2.5], new c.NamedSharding(mesh, c.P()))
  assert.equal(r.sharding.isFullyReplicated, true)
  assert.deepEqual(Array.from(await r.toTypedArray()), [1.5, 2.5])
})

test('nested arrays, scalars and their default dtypes', async () => {
  const m = c.devicePut([
    [1, 2, 3],
    [4, 5, 6],
  ])
  assert.deepEqual([m.shape, m.dtype], [[2, 3], 'float32'])
  assert.deepEqual(Array.from(await m.toTypedArray()), [1, 2, 3, 4, 5, 6])
  const s = c.devicePut(2.5)
  assert.deepEqual([s.shape, s.dtype], [[], 'float32'])
  assert.deepEqual(
    [c.devicePut(7n).dtype, c.devicePut(true).dtype, c.devicePut('hi').dtype],
    ['int64', 'bool', 'string'],
  )
  assert.deepEqual(
    Array.from(await c.devicePut([0.5, -1], null, { dtype: 'bfloat16' }).toTypedArray()),
    [0x3f00, 0xbf80],
  )
  assert.deepEqual(Array.from(await c.devicePut([1, 2], null, { dtype: 'int64' }).toTypedArray()), [1n, 2n])
  await c.blockUntilReady({ a: [m, s], b: 1 })
})

test('bad input gets typed errors', () => {
  const invalid = (fn, pattern) =>
    assert.throws(
      fn,
      (e) => e instanceof c.InvalidArgumentError && e.code === 'invalid_argument' && pattern.test(e.message),
    )
  // Wrong dtype.
  invalid(() => c.devicePut(new Float32Array(4), null, { dtype: 'int64' }), /float32 cannot be read as int64/)
  invalid(() => c.devicePut([1], null, { dtype: 'complex64' }), /unsupported dtype "complex64"/)
  invalid(() => c.devicePut([1.5], null, { dtype: 'int32' }), /not an integer/)
  invalid(() => c.devicePut([300], null, { dtype: 'uint8' }), /out of range for uint8/)
  invalid(() => c.devicePut([{}]), /numbers, bigints, booleans or strings/)
  // Shape mismatch.
  invalid(() => c.devicePut(new Float32Array(6), null, { shape: [4, 2] }), /does not hold the 6 elements/)
  invalid(() => c.devicePut([[1, 2], [3]]), /ragged/)
  const sharded = new c.NamedSharding(new c.Mesh(c.devices(), ['x']), c.P('x'))
  invalid(() => c.devicePut(new Float32Array(6), sharded), /split|divid|evenly/i)
  // A detached buffer.
  const detached = new Float32Array(4)
  structuredClone(detached.buffer, { transfer: [detached.buffer] })
  invalid(() => c.devicePut(detached), /detached/)
  // Foreign handles.
  invalid(() => c.devicePut([1], { id: 0 }), /sharding must be a NamedSharding, a SingleDeviceSharding or a Device/)
  invalid(() => new c.NamedSharding({}, c.P('x')), /Mesh/)
  invalid(() => new c.NamedSharding(new c.Mesh(c.devices(), ['x']), c.P('y')), /axis 'y'/)
  invalid(() => new c.Mesh([c.devices()[0], 3], ['x']), /devices must hold Devices, not a number/)
  invalid(() => c.makeArrayFromSingleDeviceArrays([2], c.devices()[0], [{}]), /ColocatedArray|Array/)
  // Numbers that are not what they stand for, and cycles.
  invalid(() => c.devicePut(new Float32Array(4), null, { shape: [2.5, 2] }), /non-negative integers/)
  invalid(() => new c.ShapeDtypeStruct([-1], 'float32', c.devices()[0]), /non-negative integers/)
  const cycle = [0]
  cycle[0] = cycle
  invalid(() => c.devicePut(cycle), /nest deeper/)
  invalid(() => new c.Mesh(cycle, ['x']), /nest too deep/)
})

test('a sharding says the kind of memory its arrays are in', async () => {
  const devices = c.devices().slice(0, 2)
  const mesh = new c.Mesh(devices, ['x'])
  const plain = new c.NamedSharding(mesh, c.P('x'))
  assert.equal(plain.memoryKind, 'device')
  const pinned = new c.NamedSharding(mesh, c.P('x'), { memoryKind: 'pinned_host' })
  assert.equal(pinned.memoryKind, 'pinned_host')
  assert.equal(String(pinned), "NamedSharding(mesh=Mesh('x': 2), spec=P('x'), memoryKind='pinned_host')")
  assert.equal(plain.withMemoryKind('unpinned_host').memoryKind, 'unpinned_host')
  assert.equal(pinned.withMemoryKind(null).memoryKind, 'device')
  const x = c.devicePut(new Float32Array([1, 2, 3, 4]), pinned)
  assert.equal(x.sharding.memoryKind, 'pinned_host')
  assert.deepEqual(Array.from(await x.toTypedArray()), [1, 2, 3, 4])
  // Placed again in the devices' default memory.
  assert.equal(c.devicePut(x, plain).sharding.memoryKind, 'device')
  const one = new c.SingleDeviceSharding(devices[0], { memoryKind: 'unpinned_host' })
  assert.equal(c.devicePut(new Int32Array([7]), one).sharding.memoryKind, 'unpinned_host')
  assert.throws(
    () => new c.NamedSharding(mesh, c.P('x'), { memoryKind: 'hbm' }),
    (e) => e instanceof c.InvalidArgumentError && /memory kind 'hbm' is none of/.test(e.message),
  )
})

test('a deleted array fails later uses with FailedPreconditionError', async () => {
  const x = c.devicePut([1, 2])
  x.delete()
  assert.equal(x.isDeleted, true)
  await assert.rejects(x.toTypedArray(), (e) => e instanceof c.FailedPreconditionError && /deleted/.test(e.message))
})

test('native programs: compile, execute in order, serialize and load', async () => {
  const names = c.client().loadPlugin(pluginPath())
  assert.ok(names.includes('plugin_add_one_i32'), names)
  const sharding = new c.NamedSharding(new c.Mesh(c.devices(), ['x']), c.P('x'))
  const spec = new c.ShapeDtypeStruct([8], 'int32', sharding)
  const exe = await c.compile({ language: 'native', payload: 'plugin_add_one_i32', inSpecs: [spec], outSpecs: [spec] })
  assert.equal(exe.name, 'plugin_add_one_i32')
  let x = c.devicePut(
    new Int32Array(8).map((_, i) => i),
    sharding,
  )
  // Queued back to back without waiting: program order chains them.
  for (let i = 0; i < 10; i++) x = exe.execute([x]).outputs[0]
  assert.deepEqual(Array.from(await x.toTypedArray()), [10, 11, 12, 13, 14, 15, 16, 17])
  const loaded = await c.deserializeAndLoad(exe.serialize())
  const run = loaded.execute([x])
  await run.done
  assert.deepEqual(Array.from(await run.outputs[0].toTypedArray()), [11, 12, 13, 14, 15, 16, 17, 18])
  // Wrong arguments, and a function no host knows.
  assert.throws(() => exe.execute([c.devicePut(new Float32Array(8), sharding)]), c.InvalidArgumentError)
  await assert.rejects(
    c.compile({ language: 'native', payload: 'no_such_fn', inSpecs: [spec], outSpecs: [spec] }),
    c.NotFoundError,
  )
  // A failing program rejects `done` and its outputs with its error.
  const fails = await c.compile({ language: 'native', payload: 'plugin_fail', inSpecs: [spec], outSpecs: [spec] })
  const failed = fails.execute([x])
  await assert.rejects(failed.done, c.FailedPreconditionError)
  await assert.rejects(failed.outputs[0].toTypedArray(), c.FailedPreconditionError)
  // A failure nobody awaits `done` for does not end the process.
  const unobserved = fails.execute([x]).outputs[0]
  await assert.rejects(unobserved.ready(), c.FailedPreconditionError)
})

test('the event loop keeps turning during a 256 MiB put and gather', async () => {
  let ticks = 0
  const timer = setInterval(() => ticks++, 1)
  const n = 64 << 20 // 256 MiB of float32
  const data = new Float32Array(n)
  data[n - 1] = 42
  const sharding = new c.NamedSharding(new c.Mesh(c.devices(), ['x']), c.P('x'))
  const x = c.devicePut(data, sharding)
  const before = ticks
  const back = await x.toTypedArray()
  clearInterval(timer)
  assert.equal(back[n - 1], 42)
  // The gather ran off the event loop: the timer fired meanwhile.
  assert.ok(ticks > before, `${ticks - before} ticks during the gather`)
})

test('an AbortSignal aborts waits (the work goes on) and a devicePut (its array is deleted)', async () => {
  const slow = c.colocated(async (v) => {
    await new Promise((resolve) => setTimeout(resolve, 300))
    return v
  })
  const x = c.devicePut(new Float32Array([1, 2]), c.devices()[0])
  // The first call discovers (runs the function); the second is pending for 300 ms.
  await slow(x)
  const y = await slow(x)
  const started = Date.now()
  await assert.rejects(y.ready({ signal: AbortSignal.timeout(20) }), (e) => e instanceof c.DeadlineExceededError)
  assert.ok(Date.now() - started < 250, `${Date.now() - started} ms`)
  const controller = new AbortController()
  const waiting = y.toTypedArray({ signal: controller.signal })
  controller.abort(new Error('not needed'))
  await assert.rejects(waiting, (e) => e instanceof c.CancelledError && /not needed/.test(e.message))
  // The work itself went on.
  assert.deepEqual(Array.from(await y.toTypedArray()), [1, 2])
  await assert.rejects(c.blockUntilReady([y], { signal: AbortSignal.abort() }), c.CancelledError)

  const put = c.devicePut(new Float32Array(4), null, { signal: AbortSignal.abort() })
  assert.equal(put.isDeleted, true)
  await assert.rejects(put.ready(), c.CancelledError)
  assert.throws(() => c.devicePut([1], null, { signal: 'soon' }), c.InvalidArgumentError)
  await assert.rejects(x.ready({ signal: {} }), c.InvalidArgumentError)
})

// (The test plugin was loaded by the native programs' test above.)
test('execute(args, {signal}) aborts the wait of done', async () => {
  const sharding = new c.NamedSharding(new c.Mesh(c.devices(), ['x']), c.P('x'))
  const spec = new c.ShapeDtypeStruct([8], 'int32', sharding)
  const exe = await c.compile({ language: 'native', payload: 'plugin_add_one_i32', inSpecs: [spec], outSpecs: [spec] })
  const x = c.devicePut(new Int32Array(8), sharding)
  const run = exe.execute([x], { signal: AbortSignal.abort() })
  await assert.rejects(run.done, c.CancelledError)
  assert.deepEqual(Array.from(await run.outputs[0].toTypedArray()), Array(8).fill(1))
})
