// The Node SDK driving real worker processes on 127.0.0.1: arrays over three
// hosts, programs once per host, tokens, lost workers, an event loop that
// never waits.

const test = require('node:test')
const assert = require('node:assert/strict')
const c = require('..')
const { SAMPLES, startWorker, tokenFile } = require('./helpers.js')

const token = tokenFile()
let workers = []
let client

test.before(async () => {
  workers = await Promise.all([0, 1, 2].map(() => startWorker({ devices: 2, token })))
  client = await c.connect(
    workers.map((w) => w.address),
    { tokenFile: token.file, timeout: 5000 },
  )
})

test.after(async () => {
  client?.close()
  await Promise.all(workers.map((w) => w.stop()))
})

/** A sharding of `n` of the client's devices over axis 'x'. */
function over(devices) {
  return new c.NamedSharding(new c.Mesh(devices, ['x']), c.P('x'))
}

test('a client of three workers: hosts, global device ids, the default client', () => {
  assert.deepEqual(
    client.devices().map((d) => [d.id, d.processIndex]),
    [
      [0, 1],
      [1, 1],
      [2, 2],
      [3, 2],
      [4, 3],
      [5, 3],
    ],
  )
  assert.deepEqual(
    client.hosts().map((h) => [h.name, h.isRemote]),
    workers.map((w) => [w.address, true]),
  )
  assert.equal(client.localDevices().length, 6)
  // connect() made it the default client.
  assert.equal(c.devices().length, 6)
})

test('every dtype round-trips sharded across the three workers', async () => {
  const sharding = over([0, 2, 4].map((i) => client.devices()[i]))
  for (const [dtype, [values]] of Object.entries(SAMPLES)) {
    // 8 elements over 3 devices do not split: 24 do.
    const data =
      dtype === 'string'
        ? [...values, ...values, ...values]
        : Array.from(values).concat(Array.from(values), Array.from(values))
    const typed = dtype === 'string' ? data : new values.constructor(data)
    const x = c.devicePut(typed, sharding, { dtype })
    await x.ready()
    assert.deepEqual(Array.from(await x.toTypedArray()), Array.from(typed), dtype)
    assert.deepEqual(
      x.addressableShards.map((s) => s.device.processIndex),
      [1, 2, 3],
    )
  }
})

test('a program over arrays on three hosts runs once per host with its shards', async () => {
  const sharding = over(client.devices())
  const spec = new c.ShapeDtypeStruct([12], 'int32', sharding)
  const exe = await c.compile({ language: 'native', payload: 'plugin_add_one_i32', inSpecs: [spec], outSpecs: [spec] })
  const x = c.devicePut(
    new Int32Array(12).map((_, i) => i * 10),
    sharding,
  )
  let y = x
  for (let i = 0; i < 3; i++) y = exe.execute([y]).outputs[0]
  assert.deepEqual(
    Array.from(await y.toTypedArray()),
    Array.from({ length: 12 }, (_, i) => i * 10 + 3),
  )
  // Moved between hosts and back to the controller's view.
  const moved = c.devicePut(y, over(client.devices().slice().reverse()))
  assert.deepEqual(
    Array.from(await moved.toTypedArray()),
    Array.from({ length: 12 }, (_, i) => i * 10 + 3),
  )
  // Another layout (each device holds all of it): gathered and put again,
  // without the event loop waiting for it.
  const everywhere = c.devicePut(y, new c.NamedSharding(new c.Mesh(client.devices(), ['x']), c.P()))
  assert.deepEqual(
    Array.from(await everywhere.toTypedArray()),
    Array.from({ length: 12 }, (_, i) => i * 10 + 3),
  )
})

test('a wrong token is refused with UnauthenticatedError', async () => {
  await assert.rejects(
    c.connect(workers[0].address, { token: 'not-the-token', default: false, timeout: 5000 }),
    (e) => e instanceof c.UnauthenticatedError && e.code === 'unauthenticated',
  )
  await assert.rejects(c.connect('127.0.0.1:1', { token: 'x', default: false, timeout: 1000 }), c.UnavailableError)
  // No addresses: the workers are looked for (and none is found here).
  await assert.rejects(c.connect([], { default: false, cluster: 'env' }), c.NotFoundError)
})

test('the event loop keeps turning during a 256 MiB put to a worker and back', async () => {
  let ticks = 0
  const timer = setInterval(() => ticks++, 1)
  const n = 64 << 20
  const data = new Float32Array(n)
  data[0] = 1
  data[n - 1] = 42
  const x = c.devicePut(data, client.devices()[2])
  const afterPut = ticks
  await x.ready()
  const back = await x.toTypedArray()
  clearInterval(timer)
  assert.equal(back[0], 1)
  assert.equal(back[n - 1], 42)
  assert.ok(ticks > afterPut, `${ticks - afterPut} ticks while the data travelled`)
  x.delete()
})

test('aborting a devicePut stops its transfer on the wire', async () => {
  const controller = new AbortController()
  const reports = []
  const n = 64 << 20 // 256 MiB of float32
  const x = c.devicePut(new Float32Array(n), client.devices()[2], {
    signal: controller.signal,
    onProgress: (done) => {
      reports.push(done)
      if (reports.length === 1) controller.abort(new Error('not needed'))
    },
  })
  await assert.rejects(x.ready(), (e) => e instanceof c.CancelledError && e.message === 'not needed')
  // Reports come after the fact: give the stopped transfer's last ones time.
  await new Promise((r) => setTimeout(r, 200))
  assert.ok(Math.max(...reports) < n * 4, `the whole transfer went: ${reports.at(-1)} bytes`)
  // The worker keeps nothing of it; the client goes on.
  const y = c.devicePut(new Float32Array([1, 2]), client.devices()[2])
  assert.deepEqual([...(await y.toTypedArray())], [1, 2])
})

test('onProgress follows the bytes that go to workers', async () => {
  const reports = []
  const n = 4 << 20 // 16 MiB of float32 over three workers
  const sharding = over([0, 2, 4].map((i) => client.devices()[i]))
  const x = c.devicePut(new Float32Array(n * 3), sharding, { onProgress: (done, total) => reports.push([done, total]) })
  await x.ready()
  // Reports come after the fact, on the event loop: wait for the last.
  const total = n * 3 * 4
  const deadline = Date.now() + 5000
  while (!reports.some(([done]) => done === total) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10))
  assert.ok(reports.length > 1, `${reports.length} reports`)
  assert.ok(
    reports.every(([done, all]) => all === total && done <= total),
    JSON.stringify(reports.slice(0, 3)),
  )
  assert.ok(reports.some(([done]) => done === total))
  assert.throws(() => c.devicePut([1], null, { onProgress: 3 }), c.InvalidArgumentError)
  x.delete()
})

test('kill -9 of a worker fails its pending work with UnavailableError, fast', async () => {
  const spare = await startWorker({ devices: 1, token })
  const other = await startWorker({ devices: 1, token })
  const two = await c.connect([spare.address, other.address], { tokenFile: token.file, default: false, timeout: 5000 })
  const lost = new Promise((resolve) => two.once('hostLost', (host, error) => resolve({ host, error })))
  const onSpare = c.devicePut(new Float32Array(1 << 20), two.devices()[0])
  await onSpare.ready()
  await spare.kill('SIGKILL')
  const started = Date.now()
  // A read of data that lived there, and new work there, both fail.
  await assert.rejects(onSpare.toTypedArray(), (e) => e instanceof c.UnavailableError)
  await assert.rejects(c.devicePut([1], two.devices()[0]).ready(), c.UnavailableError)
  assert.ok(Date.now() - started < 2000, `${Date.now() - started} ms`)
  // The client says which host it lost, once.
  const { host, error } = await lost
  assert.deepEqual([host.index, host.name, host.isRemote], [0, spare.address, true])
  assert.ok(error instanceof c.UnavailableError, String(error))
  assert.throws(() => two.on('hostFound', () => {}), c.InvalidArgumentError)
  // The other worker serves on.
  assert.deepEqual(Array.from(await c.devicePut([7], two.devices()[1]).toTypedArray()), [7])
  two.close()
  await other.stop()
})

test('close() ends the sessions: later work fails with CancelledError', async () => {
  const w = await startWorker({ devices: 1, token })
  const one = await c.connect(w.address, { tokenFile: token.file, default: false, timeout: 5000 })
  const x = c.devicePut([1, 2], one.devices()[0])
  await x.ready()
  one.close()
  await assert.rejects(x.toTypedArray(), (e) => e instanceof c.CancelledError && /closed/.test(e.message))
  // A first listener added after the loss hears it at once.
  const told = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('hostLost was not told')), 10000)
    one.once('hostLost', (host, error) => {
      clearTimeout(timer)
      resolve({ host, error })
    })
  })
  assert.deepEqual([told.host.index, told.host.name], [0, w.address])
  assert.ok(told.error instanceof c.CancelledError, String(told.error))
  await w.stop()
})

test('host event listeners do not keep the process alive', async () => {
  // A process that connects, listens to every host event and returns: it
  // must exit by itself, its client still open.
  const script = `
    const c = require(${JSON.stringify(require.resolve('..'))})
    c.connect(process.env.WORKER, { tokenFile: process.env.TOKEN_FILE, timeout: 5000 }).then((client) => {
      for (const event of ['hostDisconnected', 'hostReconnected', 'hostLost', 'hostReopened']) client.on(event, () => {})
      console.log('listening')
    })
  `
  const env = { ...process.env, WORKER: workers[0].address, TOKEN_FILE: token.file }
  const { stdout } = await new Promise((resolve, reject) =>
    require('node:child_process').execFile(
      process.execPath,
      ['-e', script],
      { env, timeout: 20000 },
      (err, stdout, stderr) => (err ? reject(new Error(`${err.message}: ${stderr}`)) : resolve({ stdout })),
    ),
  )
  assert.equal(stdout.trim(), 'listening')
})

/** A port nothing listens on now. */
function freePort() {
  return new Promise((resolve) => {
    const server = require('node:net').createServer()
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })
}

test('connect() without addresses finds COLOCATED_WORKERS and waits for workers still starting', async () => {
  const ports = [await freePort(), await freePort()]
  const saved = process.env.COLOCATED_WORKERS
  process.env.COLOCATED_WORKERS = ports.map((p) => `127.0.0.1:${p}`).join(',')
  const started = []
  try {
    // The controller waits while the workers come up.
    const connecting = c.connect({ tokenFile: token.file, default: false, timeout: 30000 })
    for (const port of ports) started.push(await startWorker({ token, listen: `127.0.0.1:${port}` }))
    const found = await connecting
    assert.deepEqual(
      found.devices().map((d) => d.processIndex),
      [1, 2],
    )
    found.close()
    await assert.rejects(c.connect({ cluster: 'mesos', default: false }), c.InvalidArgumentError)
    delete process.env.COLOCATED_WORKERS
    await assert.rejects(
      c.connect({ cluster: 'env', default: false }),
      (e) => e instanceof c.NotFoundError && e.message.includes('COLOCATED_WORKERS'),
    )
  } finally {
    if (saved === undefined) delete process.env.COLOCATED_WORKERS
    else process.env.COLOCATED_WORKERS = saved
    await Promise.all(started.map((w) => w.stop()))
  }
})

test('npx colocated status prints one line per worker and exits 1 if one does not answer', async () => {
  const { execFile } = require('node:child_process')
  const bin = require('node:path').join(__dirname, '..', 'bin', 'colocated.js')
  const run = (args) =>
    new Promise((resolve) => {
      execFile(process.execPath, [bin, 'status', ...args, '--token-file', token.file], (err, stdout, stderr) =>
        resolve({ code: err ? err.code : 0, stdout, stderr }),
      )
    })
  const ok = await run([workers[0].address, workers[1].address])
  assert.equal(ok.code, 0, ok.stderr)
  const lines = ok.stdout.trim().split('\n')
  assert.equal(lines.length, 2)
  assert.match(lines[0], new RegExp(`^${workers[0].address}  colocated \\d+\\.\\d+\\.\\d+ .*2 cpu devices`))
  const gone = `127.0.0.1:${await freePort()}`
  const one = await run([workers[0].address, gone, '--timeout', '0.5'])
  assert.equal(one.code, 1)
  assert.match(one.stdout.trim().split('\n')[1], new RegExp(`^${gone}  unavailable`))
})
