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

// Host callbacks given by name: async functions of values in the program.

/** Values of every kind a host callback carries (the local host reads them from the global object). */
const SENT = {
  text: 'héllo',
  n: 3.5,
  big: 2n ** 70n,
  nan: Number.NaN,
  inf: Number.NEGATIVE_INFINITY,
  nothing: undefined,
  nil: null,
  f32: new Float32Array([1.5, -2]),
  i64: new BigInt64Array([-1n, 2n ** 62n]),
  u8: new Uint8Array([0, 255]),
  buf: Buffer.from('bytes'),
  nested: [{ deep: [1, 'two', [true, false]] }],
  // An object of the caller's own that looks like the encoding's tags.
  tagged: { $colocated: 'bigint', value: '1' },
  // As JSON sends it: its toJSON().
  date: new Date(0),
}

test('a callback given by name is an async function of values, wherever the program gets it', async () => {
  const heard = []
  const log = c.hostCallback(async (msg, n) => {
    await new Promise((resolve) => setTimeout(resolve, 5))
    heard.push([msg, n])
    return { msg, twice: n * 2 }
  })
  globalThis.sent = SENT
  const f = c
    .colocated(
      async (x) => {
        const { log, echo } = colocated.hostCallbacks
        const answer = await log('hi', 3)
        globalThis.echoed = await echo(globalThis.sent, undefined)
        globalThis.seen = { keys: Object.keys(colocated.hostCallbacks), has: 'log' in colocated.hostCallbacks }
        globalThis.nothing = await colocated.hostCallbacks.quiet()
        const data = await x.toTypedArray()
        return colocated.devicePut(
          data.map(() => answer.twice),
          x.sharding,
        )
      },
      // A function as it is, or made by hostCallback(fn).
      { hostCallbacks: { log, echo: (...args) => args, quiet: () => {} } },
    )
    .specialize({ outSpecsFn: (x) => x })
  const x = c.devicePut(new Int32Array([0, 0]), c.devices()[0])
  assert.deepEqual(Array.from(await (await f(x)).toTypedArray()), [6, 6])
  assert.deepEqual(heard, [['hi', 3]])
  assert.deepEqual(globalThis.echoed, [{ ...SENT, date: '1970-01-01T00:00:00.000Z' }, undefined])
  assert.ok(Buffer.isBuffer(globalThis.echoed[0].buf))
  assert.deepEqual(globalThis.seen, { keys: ['log', 'echo', 'quiet'], has: true })
  assert.equal(globalThis.nothing, undefined)

  // Given by specialize, and to a colocated class.
  const g = c
    .colocated(async (x) => {
      await colocated.hostCallbacks.log('from g', 1)
      return x
    })
    .specialize({ hostCallbacks: { log }, outSpecsFn: (x) => x })
  await (await g(x)).ready()
  class Counter {
    async count(x) {
      await colocated.hostCallbacks.log('from a method', 2)
      return x
    }
  }
  const counter = new (c.colocatedClass(Counter, { hostCallbacks: { log } }))()
  await (await counter.count(x)).ready()
  counter.dispose()
  assert.deepEqual(heard.slice(1), [
    ['from g', 1],
    // (Discovery ran the method; its outputs are the call's.)
    ['from a method', 2],
  ])
})

test('by name: a callback’s error reaches the caller with its code; what cannot be sent is InvalidArgumentError', async () => {
  const x = c.devicePut(new Int32Array([0]), c.devices()[1])
  // A call of `body` with `hostCallbacks` (its outputs declared: a failure shows in them).
  const calling = (hostCallbacks, body) => {
    const f = c.colocated(body, { hostCallbacks }).specialize({ outSpecsFn: (x) => x })
    return async (x) => (await f(x)).ready()
  }
  const refuse = () => {
    throw new c.PermissionDeniedError('not you')
  }
  await assert.rejects(
    calling({ refuse }, async (x) => {
      await colocated.hostCallbacks.refuse()
      return x
    })(x),
    (e) => e instanceof c.PermissionDeniedError && e.code === 'permission_denied' && /not you/.test(e.message),
  )
  // The program may catch it, as any rejection.
  globalThis.caught = null
  await calling({ refuse }, async (x) => {
    globalThis.caught = await colocated.hostCallbacks.refuse().catch((e) => [e.code, e.message])
    return x
  })(x)
  assert.equal(globalThis.caught[0], 'permission_denied')
  assert.match(globalThis.caught[1], /not you/)

  const invalid = (pattern) => (e) =>
    e instanceof c.InvalidArgumentError && e.code === 'invalid_argument' && pattern.test(e.message)
  const log = () => 'ok'
  await assert.rejects(
    calling({ log }, async (x) => {
      await colocated.hostCallbacks.log('fine', { onDone: () => {} })
      return x
    })(x),
    invalid(/host callback 'log': arguments\[1\]\.onDone cannot be sent: a function/),
  )
  await assert.rejects(
    calling({ log }, async (x) => {
      const cycle = []
      cycle.push(cycle)
      await colocated.hostCallbacks.log(cycle)
      return x
    })(x),
    invalid(/arguments\[0\]\[0\] cannot be sent: it contains itself/),
  )
  await assert.rejects(
    calling({ log }, async (x) => {
      await colocated.hostCallbacks.log(x)
      return x
    })(x),
    invalid(/arguments\[0\] cannot be sent: a ColocatedArray \(send `await x.toTypedArray\(\)`/),
  )
  await assert.rejects(
    calling({ log: () => new Map() }, async (x) => {
      await colocated.hostCallbacks.log()
      return x
    })(x),
    invalid(/host callback 'log': its result cannot be sent: a Map/),
  )
  await assert.rejects(
    calling({ log }, async (x) => {
      await colocated.hostCallbacks.nope()
      return x
    })(x),
    invalid(/host callback 'nope' was not given to this function \(its host callbacks: log\)/),
  )
  await assert.rejects(c.hostCallbacks.log('x'), invalid(/for code that runs as a colocated function/))
  // An object of named callbacks is for colocated functions; compile takes them by index.
  assert.throws(() => c.colocated((v) => v, { hostCallbacks: { log: 3 } }), invalid(/hostCallbacks\.log must be/))
})

test('by name, on Node workers: values both ways, errors, and values that cannot be sent', async () => {
  const token = tokenFile()
  const workers = await Promise.all([0, 1].map(() => startWorker({ devices: 1, token, node: true })))
  try {
    const client = await c.connect(
      workers.map((w) => w.address),
      { tokenFile: token.file, default: false },
    )
    const heard = new Map()
    const where = async (pid, data) => {
      heard.set(pid, data)
      return { sum: data.reduce((a, b) => a + b, 0), type: data.constructor.name, big: 2n ** 64n }
    }
    const sharding = new c.NamedSharding(new c.Mesh(client.devices(), ['x']), c.P('x'))
    const f = c
      .colocated(
        async (x) => {
          const data = await x.toTypedArray()
          const answer = await colocated.hostCallbacks.where(process.pid, data)
          const ok = answer.type === 'Int32Array' && answer.big === 2n ** 64n
          return colocated.devicePut(
            data.map(() => (ok ? answer.sum : -1)),
            x.sharding,
          )
        },
        { hostCallbacks: { where } },
      )
      .specialize({ outSpecsFn: (x) => x })
    const x = c.devicePut(new Int32Array([5, 7]), sharding)
    assert.deepEqual(Array.from(await (await f(x)).toTypedArray()), [5, 7])
    // Each worker sent its pid and its shard, as an Int32Array.
    assert.deepEqual([...heard.keys()].sort(), workers.map((w) => w.pid).sort())
    assert.deepEqual(
      workers.map((w) => heard.get(w.pid)),
      [new Int32Array([5]), new Int32Array([7])],
    )

    const refuse = () => {
      throw new c.PermissionDeniedError('not you')
    }
    const g = c.colocated(
      async (x) => {
        await colocated.hostCallbacks.refuse()
        return x
      },
      { hostCallbacks: { refuse } },
    )
    // Its outputs declared, the call's failure shows in its outputs; discovering, in the call.
    await assert.rejects(
      (async () => (await g.specialize({ outSpecsFn: (x) => x })(x)).ready())(),
      (e) => e instanceof c.PermissionDeniedError && /not you/.test(e.message),
    )
    const h = c.colocated(
      async (x) => {
        await colocated.hostCallbacks.where(new Set([1]))
        return x
      },
      { hostCallbacks: { where } },
    )
    await assert.rejects(
      h(x),
      (e) =>
        e instanceof c.InvalidArgumentError &&
        /host callback 'where': arguments\[0\] cannot be sent: a Set/.test(e.message),
    )
    client.close()
  } finally {
    await Promise.all(workers.map((w) => w.stop()))
  }
})
