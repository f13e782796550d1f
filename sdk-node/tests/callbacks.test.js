// hostCallback(fn): JavaScript functions of the controller that programs on
// any host call, run on the controller's event loop.

const test = require('node:test')
const assert = require('node:assert/strict')
const c = require('..')
const { startWorker, tokenFile } = require('./helpers.js')

c.configure({ numCpuDevices: 2 })

/** A function that asks host callback 0 and returns an array of its answer's length. */
const ask = async (x) => {
  const answer = await colocated.callHost(0, `pid ${process.pid}`)
  const data = await x.toTypedArray()
  return colocated.devicePut(
    data.map(() => answer.length),
    x.sharding,
  )
}

test('a program calls the controller’s callback, which may be async', async () => {
  const heard = []
  const log = c.hostCallback(async (input) => {
    await new Promise((resolve) => setTimeout(resolve, 5))
    heard.push(input.toString())
    return `heard ${input}`
  })
  const f = c.colocated(ask).specialize({ hostCallbacks: [log] })
  const x = c.devicePut(new Int32Array([0, 0]), c.devices()[0])
  const out = await f(x)
  const expected = `heard pid ${process.pid}`.length
  assert.deepEqual(Array.from(await out.toTypedArray()), [expected, expected])
  // Discovery ran it once, and the program it compiled once more.
  await (await f(x)).ready()
  assert.deepEqual(heard, [`pid ${process.pid}`, `pid ${process.pid}`])
})

test('a callback’s error fails the program with it; callHost outside a program is refused', async () => {
  const refuse = c.hostCallback(() => {
    throw new c.PermissionDeniedError('not you')
  })
  const x = c.devicePut(new Int32Array([0]), c.devices()[1])
  await assert.rejects(
    c.colocated(ask).specialize({ hostCallbacks: [refuse] })(x),
    (e) => e instanceof c.PermissionDeniedError && /not you/.test(e.message),
  )
  // A program without that callback.
  await assert.rejects(
    c.colocated(ask)(x),
    (e) => e instanceof c.InvalidArgumentError && /out of range/.test(e.message),
  )
  await assert.rejects(c.callHost(0, 'x'), c.InvalidArgumentError)
  assert.throws(() => c.hostCallback(3), c.InvalidArgumentError)
})

test('programs on Node workers call it too', async () => {
  const token = tokenFile()
  const workers = await Promise.all([0, 1].map(() => startWorker({ devices: 1, token, node: true })))
  try {
    const client = await c.connect(
      workers.map((w) => w.address),
      { tokenFile: token.file, default: false },
    )
    const heard = new Set()
    const log = c.hostCallback((input) => {
      heard.add(input.toString())
      return 'ok'
    })
    const sharding = new c.NamedSharding(new c.Mesh(client.devices(), ['x']), c.P('x'))
    const f = c.colocated(ask).specialize({ hostCallbacks: [log] })
    const out = await f(c.devicePut(new Int32Array([0, 0]), sharding))
    assert.deepEqual(Array.from(await out.toTypedArray()), [2, 2])
    assert.deepEqual([...heard].sort(), workers.map((w) => `pid ${w.pid}`).sort())
    client.close()
  } finally {
    await Promise.all(workers.map((w) => w.stop()))
  }
})
