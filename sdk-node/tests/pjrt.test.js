// PJRT plugins (XLA's CPU plugin from PyPI; `make test-node` sets
// COLOCATED_TEST_PJRT_PLUGIN): a plugin's devices as the default backend,
// arrays on them, StableHLO modules compiled and run there, here and on a
// Node worker started with --pjrt-plugin.

const test = require('node:test')
const assert = require('node:assert/strict')
const c = require('..')
const { startWorker, tokenFile } = require('./helpers.js')

const PLUGIN = process.env.COLOCATED_TEST_PJRT_PLUGIN
const skip = PLUGIN ? false : 'COLOCATED_TEST_PJRT_PLUGIN is unset (make test-node sets it)'
if (!PLUGIN && process.env.CI) throw new Error('COLOCATED_TEST_PJRT_PLUGIN is unset in CI')

const ADD_ONE = `
module @add_one {
  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %c = stablehlo.constant dense<1.0> : tensor<4xf32>
    %0 = stablehlo.add %arg0, %c : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}`

if (PLUGIN) c.configure({ numCpuDevices: 1, pjrtPlugin: PLUGIN, pjrtOptions: { cpu_device_count: 2 } })

test('a plugin’s devices are the default backend beside the CPU devices', { skip }, () => {
  assert.equal(c.defaultBackend(), 'pjrt_cpu')
  const plugin = c.devices()
  assert.deepEqual(
    plugin.map((d) => [d.id, d.platform, d.backend, d.kind]),
    [
      [1, 'cpu', 'pjrt_cpu', 'cpu'],
      [2, 'cpu', 'pjrt_cpu', 'cpu'],
    ],
  )
  const cpu = c.devices('cpu')
  assert.deepEqual(
    cpu.map((d) => d.backend),
    ['cpu'],
  )
  assert.deepEqual(
    c.colocatedCpuDevices(plugin).map((d) => d.id),
    [0, 0],
  )
  assert.throws(() => c.devices('tpu'), c.NotFoundError)
  assert.throws(() => c.devices(3), c.InvalidArgumentError)
})

test('a StableHLO module runs on a plugin device, in order, and reads back', { skip }, async () => {
  const [device] = c.devices()
  const f = await c.compileStablehlo(ADD_ONE, [device])
  const x = c.devicePut(new Float32Array([0.5, 1.5, 2.5, -1]), device)
  const once = f.execute([x]).outputs[0]
  const twice = f.execute([once]).outputs[0]
  assert.deepEqual(Array.from(await twice.toTypedArray()), [2.5, 3.5, 4.5, 1])
  // The default device is the default backend's first.
  const g = await c.compileStablehlo(Buffer.from(ADD_ONE))
  assert.deepEqual(
    g.devices.map((d) => d.id),
    [device.id],
  )
})

test('bad modules and options get typed errors', { skip }, async () => {
  const [device] = c.devices()
  await assert.rejects(c.compileStablehlo('not mlir', [device]), c.InvalidArgumentError)
  await assert.rejects(c.compileStablehlo(ADD_ONE, c.devices('cpu')), /CPU devices/)
  await assert.rejects(c.compileStablehlo(42, [device]), c.InvalidArgumentError)
  assert.throws(() => c.configure({ pjrtPlugin: 3 }), c.InvalidArgumentError)
  assert.throws(() => c.configure({ pjrtOptions: { cpu_device_count: {} } }), c.InvalidArgumentError)
  // The default client exists: configuring again is too late.
  assert.throws(() => c.configure({ numCpuDevices: 2 }), c.FailedPreconditionError)
  const strings = () => c.devicePut(['a', 'b'], device)
  assert.throws(strings, /CPU devices only/)
})

test('a Node worker serves a plugin given on its command line', { skip }, async () => {
  const token = tokenFile()
  const worker = await startWorker({
    node: true,
    token,
    extra: ['--pjrt-plugin', PLUGIN, '--pjrt-option', 'cpu_device_count=2'],
  })
  try {
    const client = await c.connect(worker.address, { tokenFile: token.file, default: false })
    assert.equal(client.defaultBackend(), 'pjrt_cpu')
    const plugin = client.devices()
    assert.equal(plugin.length, 2)
    const f = await c.compileStablehlo(ADD_ONE, [plugin[1]])
    const x = c.devicePut(new Float32Array([1, 2, 3, 4]), plugin[1])
    assert.deepEqual(Array.from(await f.execute([x]).outputs[0].toTypedArray()), [2, 3, 4, 5])
    client.close()
  } finally {
    await worker.stop()
  }
})
