// Every constructor, function and options object answers a value of the
// wrong type with InvalidArgumentError naming the argument and what it must
// be (never the binding layer's own message); PartitionSpec takes its
// entries as arguments, as JAX's does.

const test = require('node:test')
const assert = require('node:assert/strict')
const c = require('..')
const { pluginPath } = require('./helpers.js')

c.configure({ numCpuDevices: 2 })

test('new PartitionSpec takes its entries as arguments, as P and JAX do', () => {
  assert.equal(String(new c.PartitionSpec('x')), "P('x')")
  assert.equal(String(new c.PartitionSpec('x', null)), "P('x', null)")
  assert.deepEqual(new c.PartitionSpec(['x', 'y'], null).entries, [['x', 'y'], []])
  assert.deepEqual(new c.PartitionSpec().entries, [])
  assert.deepEqual(new c.PartitionSpec('x', null).entries, c.P('x', null).entries)
  assert.ok(c.P('x') instanceof c.PartitionSpec)
  const mesh = new c.Mesh(c.devices(), ['x'])
  const sharding = new c.NamedSharding(mesh, new c.PartitionSpec('x'))
  assert.equal(String(sharding.spec), "P('x')")
  assert.ok(sharding.spec instanceof c.PartitionSpec)
})

test('a value of the wrong type gets InvalidArgumentError naming the argument and the type it must be', async () => {
  const devices = c.devices()
  const device = devices[0]
  const mesh = new c.Mesh(devices, ['x'])
  const sharding = new c.NamedSharding(mesh, c.P('x'))
  const x = c.devicePut(new Int32Array([1, 2]), sharding)
  const client = c.client()
  client.loadPlugin(pluginPath())
  const spec = new c.ShapeDtypeStruct([2], 'int32', sharding)
  const exe = await c.compile({ language: 'native', payload: 'plugin_add_one_i32', inSpecs: [spec], outSpecs: [spec] })
  const f = c.colocated((v) => v)
  const native = { language: 'native', payload: 'plugin_add_one_i32', inSpecs: [spec], outSpecs: [spec] }

  // [what is called, how it fails ('throws' or 'rejects'), a stable part of the message]
  const cases = [
    // Constructors.
    [
      () => new c.PartitionSpec('x', 3),
      'throws',
      'PartitionSpec: entries[1] must be an axis name (a string), an array',
    ],
    [() => new c.PartitionSpec(['x', 1]), 'throws', 'PartitionSpec: entries[0][1] must be a string, not a number (1)'],
    [() => new c.PartitionSpec(undefined), 'throws', 'PartitionSpec: entries[0] must be'],
    [
      () => c.P({}),
      'throws',
      'P: entries[0] must be an axis name (a string), an array of axis names (strings) or null',
    ],
    [() => new c.Mesh('cpu', ['x']), 'throws', 'Mesh: devices must be an array of Devices'],
    [
      () => new c.Mesh(devices, 'x'),
      'throws',
      'Mesh: axisNames must be an array of axis names (strings), not a string',
    ],
    [() => new c.Mesh(devices, ['x', 1]), 'throws', 'Mesh: axisNames[1] must be a string, not a number (1)'],
    [() => new c.Mesh([device, 3], ['x']), 'throws', 'Mesh: devices must hold Devices, not a number'],
    [() => new c.NamedSharding(devices, c.P('x')), 'throws', 'NamedSharding: mesh must be a Mesh, not an array'],
    [() => new c.NamedSharding(mesh, ['x']), 'throws', 'NamedSharding: spec must be a PartitionSpec, not an array'],
    [() => new c.SingleDeviceSharding(0), 'throws', 'SingleDeviceSharding: device must be a Device, not a number (0)'],
    [() => new c.ShapeDtypeStruct(2, 'int32', device), 'throws', 'ShapeDtypeStruct: shape must be an array of numbers'],
    [() => new c.ShapeDtypeStruct(['2'], 'int32', device), 'throws', 'ShapeDtypeStruct: shape[0] must be a number'],
    [() => new c.ShapeDtypeStruct([2], Int32Array, device), 'throws', 'ShapeDtypeStruct: dtype must be a string'],
    [
      () => new c.ShapeDtypeStruct([2], 'int32', 'cpu:0'),
      'throws',
      'ShapeDtypeStruct: sharding must be a NamedSharding, a SingleDeviceSharding or a Device, not a string',
    ],
    [() => new c.HostCallback(3, () => {}), 'throws', 'HostCallback: name must be a string, not a number (3)'],
    [() => new c.HostCallback('log', 'run'), 'throws', 'HostCallback: run must be a function, not a string'],
    [() => new c.Device(), 'throws', 'Device has no public constructor: its objects come from devices()'],
    [() => new c.Array(), 'throws', 'ColocatedArray has no public constructor'],
    [() => new c.Client(), 'throws', 'Client has no public constructor'],
    [() => new c.LoadedExecutable(), 'throws', 'LoadedExecutable has no public constructor'],
    [() => new c.Stream(), 'throws', 'Stream has no public constructor'],

    // Functions and their options.
    [() => c.configure(4), 'throws', 'configure: options must be an object, not a number (4)'],
    [() => c.configure({ numCpuDevices: '4' }), 'throws', 'configure: options.numCpuDevices must be a number'],
    [() => c.configure({ executorThreads: true }), 'throws', 'configure: options.executorThreads must be a number'],
    [() => c.colocatedCpuDevices(device), 'throws', 'colocatedCpuDevices: devices must be an array of Devices'],
    [() => c.devicePut(Symbol('x')), 'throws', 'devicePut: data must be a typed array, a number, a bigint'],
    [() => c.devicePut([1], 'cpu:0'), 'throws', 'devicePut: sharding must be a NamedSharding, a SingleDeviceSharding'],
    [() => c.devicePut([1], { id: 0 }), 'throws', 'devicePut: sharding must be a NamedSharding'],
    [() => c.devicePut([1], null, 'float32'), 'throws', 'devicePut: options must be an object, not a string'],
    [() => c.devicePut([1], null, { dtype: 3 }), 'throws', 'devicePut: options.dtype must be a string, not a number'],
    [() => c.devicePut([1], null, { shape: 1 }), 'throws', 'devicePut: options.shape must be an array of numbers'],
    [
      () => c.devicePut([1], null, { stream: {} }),
      'throws',
      'devicePut: options.stream must be a Stream, not an object',
    ],
    [() => c.devicePut([1], null, { onProgress: 3 }), 'throws', 'devicePut: options.onProgress must be a function'],
    [() => c.devicePut([1], null, { signal: 'soon' }), 'throws', 'devicePut: options.signal must be an AbortSignal'],
    [
      () => c.makeArrayFromSingleDeviceArrays([2], sharding, [x, 3]),
      'throws',
      'makeArrayFromSingleDeviceArrays: arrays[1] must be an Array, not a number',
    ],
    [
      () => c.makeArrayFromSingleDeviceArrays(2, sharding, [x]),
      'throws',
      'makeArrayFromSingleDeviceArrays: shape must be',
    ],
    [() => c.compile('f'), 'rejects', 'compile: program must be an object, not a string'],
    [
      () => c.compile({ ...native, language: 1 }),
      'rejects',
      'compile: program.language must be a string, not a number',
    ],
    [() => c.compile({ ...native, payload: 3 }), 'rejects', 'compile: program.payload must be a string or a Buffer'],
    [() => c.compile({ ...native, inSpecs: [x] }), 'rejects', 'compile: program.inSpecs[0] must be a ShapeDtypeStruct'],
    [() => c.compile({ ...native, outSpecs: undefined }), 'rejects', 'compile: program.outSpecs must be an array of'],
    [
      () => c.compile({ ...native, devices: device }),
      'rejects',
      'compile: program.devices must be an array of Devices',
    ],
    [
      () => c.compile({ ...native, hostCallbacks: [() => {}] }),
      'rejects',
      'compile: program.hostCallbacks[0] must be a HostCallback, not a function',
    ],
    [() => c.connect(8080), 'rejects', 'connect: addresses must be a string or an array of addresses (strings)'],
    [() => c.connect(['127.0.0.1:1', 2]), 'rejects', 'connect: addresses[1] must be a string, not a number (2)'],
    [() => c.connect('127.0.0.1:1', 'token'), 'rejects', 'connect: options must be an object, not a string'],
    [() => c.connect('127.0.0.1:1', { timeout: '5s' }), 'rejects', 'connect: options.timeout must be a number'],
    [() => c.connect('127.0.0.1:1', { tlsCa: 1 }), 'rejects', 'connect: options.tlsCa must be a string or a Buffer'],
    [() => c.connect('127.0.0.1:1', { includeLocal: 1 }), 'rejects', 'connect: options.includeLocal must be a boolean'],
    [() => c.connect({ cluster: 3 }), 'rejects', 'connect: options.cluster must be a string, not a number (3)'],
    [() => c.connect({ port: '61440' }), 'rejects', 'connect: options.port must be a number'],
    [() => c.connect({ signal: {} }), 'rejects', 'connect: options.signal must be an AbortSignal, not an object'],
    [() => c.deserializeAndLoad('bytes'), 'rejects', 'deserializeAndLoad: bytes must be a Buffer or a Uint8Array'],
    [() => c.deserializeAndLoad(exe.serialize(), {}), 'rejects', 'deserializeAndLoad: client must be a Client'],
    [() => c.blockUntilReady([x], 1), 'rejects', 'blockUntilReady: options must be an object, not a number (1)'],
    [() => c.colocated(42), 'throws', 'colocated: fn must be a function or {module, export}, not a number (42)'],
    [() => c.colocated({ module: 1 }), 'throws', 'colocated: fn.module must be a string'],
    [() => c.colocated((v) => v, { outSpecsFn: 3 }), 'throws', 'colocated: options.outSpecsFn must be a function'],
    [() => f.specialize('fast'), 'throws', 'specialize: options must be an object, not a string'],
    [() => f.specialize({ devices: device }), 'throws', 'specialize: options.devices must be an array of Devices'],
    [
      () => f.specialize({ inSpecs: spec }),
      'throws',
      'specialize: options.inSpecs must be an array of ShapeDtypeStructs',
    ],
    [
      () => f.specialize({ hostCallbacks: 3 }),
      'throws',
      'specialize: options.hostCallbacks must be an array of HostCallbacks or an object of functions',
    ],
    [
      () => f.specialize({ hostCallbacks: { log: 'console' } }),
      'throws',
      'specialize: options.hostCallbacks.log must be a function or a HostCallback, not a string',
    ],
    [() => c.colocatedClass(3), 'throws', 'colocatedClass: Class must be a function or {module, export}'],
    [
      () => c.colocatedClass({ module: 'm' }, { methods: 'add' }),
      'throws',
      'colocatedClass: options.methods must be an array of method names',
    ],
    [() => c.hostCallback('log'), 'throws', 'hostCallback: fn must be a function, not a string'],
    [() => c.hostCallback(() => {}, 3), 'throws', 'hostCallback: name must be a string, not a number (3)'],
    [() => c.callHost('0'), 'rejects', 'callHost: index must be a number, not a string'],
    [() => c.callHost(0, 3), 'rejects', 'callHost: data must be a Buffer or a Uint8Array or a string, not a number'],

    // Methods.
    [() => exe.execute(x), 'throws', 'LoadedExecutable.execute: args must be an array of Arrays, not a ColocatedArray'],
    [() => exe.execute([x], { stream: 1 }), 'throws', 'LoadedExecutable.execute: options.stream must be a Stream'],
    [() => x.ready(1), 'rejects', 'ColocatedArray.ready: options must be an object, not a number (1)'],
    [
      () => x.toTypedArray({ signal: 1 }),
      'rejects',
      'ColocatedArray.toTypedArray: options.signal must be an AbortSignal',
    ],
    [() => client.loadPlugin(1), 'throws', 'Client.loadPlugin: path must be a string, not a number (1)'],
    [() => client.createStream().run(1), 'throws', 'Stream.run: fn must be a function, not a number (1)'],
    [() => client.on('hostLost', 'log'), 'throws', 'Client.on: listener must be a function, not a string'],
    [() => client.once(Symbol('hostLost'), () => {}), 'throws', 'Client.once: event must be a string, not a symbol'],
  ]
  for (const [call, how, message] of cases) {
    const expected = (e) => {
      assert.ok(e instanceof c.InvalidArgumentError, `${message}: got ${e?.constructor?.name}: ${e?.message}`)
      assert.equal(e.code, 'invalid_argument')
      assert.ok(e.message.includes(message), `expected ${JSON.stringify(message)} in ${JSON.stringify(e.message)}`)
      return true
    }
    if (how === 'throws') {
      assert.throws(call, expected)
    } else {
      // Refused at once, as a rejected Promise (a function that returns a Promise does not throw).
      let promise
      assert.doesNotThrow(() => {
        promise = call()
      }, message)
      await assert.rejects(promise, expected)
    }
  }
})
