// `colocated(fn)`: JavaScript functions that run on the hosts that own their
// arguments' devices (the `node` language). Core owns the protocol (call
// rules, the cache per input spec, discovery); this file is what is
// JavaScript's own: flattening arguments and results (trees.js) and
// evaluating a function's source on a host. Program
// order is core's: a call that compiles holds its place in its stream.

const { AsyncLocalStorage } = require('node:async_hooks')
const { threadId } = require('node:worker_threads')
const signatures = require('./arguments.js')
const errors = require('./errors.js')
const streams = require('./streams.js')
const trees = require('./trees.js')
const values = require('./values.js')

module.exports = function install(binding, exports) {
  const { ColocatedArray, FunctionState } = binding

  // The call's tree (trees.js), its arrays as leaves by default.
  const flatten = (tree, what, Leaf = ColocatedArray) => trees.flatten(tree, what, Leaf)
  const { unflatten, structureOf } = trees

  // -- hosts ----------------------------------------------------------------

  const notByValue = () =>
    new errors.InvalidArgumentError(
      'this function or class is not self-contained (a TypeScript decorator compiled it, or it refers to names around it): ' +
        'only the process that defined it can run it; for other hosts, name it as {module, export}',
    )

  // Functions loaded on this host, by program id.
  const loaded = new Map()

  // What core keeps for this thread, by its token's id (`src/kept.rs`): this
  // process's own functions and classes ({fn}, in core's registry of local
  // values) and objects of colocated classes ({object}: a Promise of {value}
  // or {error}, in core's host-object store). A JavaScript value cannot
  // leave its thread: when core drops a token, the forgetter releases it here.
  const held = new Map()

  async function load(call) {
    let fn = loaded.get(call.program)
    if (fn !== undefined) return fn
    const payload = JSON.parse(call.payload)
    const mine = call.local === null ? undefined : held.get(call.local)
    if (typeof payload.source === 'string') {
      // A self-contained function, evaluated in the global scope (on every
      // host alike); it may use `require` and `colocated` (this package).
      fn = new Function('require', 'colocated', `return (${payload.source})`)(require, exports)
    } else if (mine !== undefined) {
      // Not self-contained: this process runs it as it is.
      fn = mine.fn
    } else if (typeof payload.module === 'string') {
      const module = await import(payload.module)
      fn = module[payload.export]
    } else {
      throw notByValue()
    }
    if (typeof fn !== 'function') {
      throw new errors.InvalidArgumentError(`the program's payload is not a function: ${call.payload.slice(0, 200)}`)
    }
    loaded.set(call.program, fn)
    return fn
  }

  const dispose = (entry) =>
    entry.then((built) => {
      const value = built.value
      if (value !== undefined && typeof value[Symbol.dispose] === 'function') value[Symbol.dispose]()
    })
  // Every JavaScript thread that loads the package hosts: it runs the
  // programs of the functions it defined (others' run on the main thread).
  binding._setForgetter((job) => {
    if (job.program !== null && job.program !== undefined) {
      loaded.delete(job.program)
      return
    }
    const entry = held.get(job.value)
    if (entry === undefined) return
    held.delete(job.value)
    if (entry.object !== undefined) dispose(entry.object).catch(() => {})
  }, threadId)

  /** The object a method call runs on: built on its first call here (core's store decides). */
  function hostObject(call, object) {
    const { value, built } = call.hostObject(object.id)
    if (!built && held.has(value)) return held.get(value).object
    const promise = (async () => {
      try {
        const Class = await loadClass(object.class, call.local)
        return { value: new Class(...object.args) }
      } catch (error) {
        return { error }
      }
    })()
    held.set(value, { object: promise })
    return promise
  }

  const classes = new Map() // by source or module
  async function loadClass(what, localId) {
    // This process's own, in core's registry (not cached here).
    if (typeof what.source !== 'string' && held.has(localId)) return held.get(localId).fn
    const key = JSON.stringify({ ...what, local: undefined })
    let Class = classes.get(key)
    if (Class === undefined) {
      if (typeof what.source === 'string') {
        Class = new Function('require', 'colocated', `return (${what.source})`)(require, exports)
      } else if (typeof what.module === 'string') Class = (await import(what.module))[what.export]
      else throw notByValue()
      if (typeof Class !== 'function') throw new errors.InvalidArgumentError(`not a class: ${key.slice(0, 200)}`)
      classes.set(key, Class)
    }
    return Class
  }

  // The host call a function's code runs for (across its awaits), and the
  // names of its program's host callbacks: where `callHost` and
  // `hostCallbacks` find the program's host callbacks.
  const current = new AsyncLocalStorage()

  /** The message of anything thrown (which may not even convert to a string). */
  function describeError(err) {
    try {
      return String(err?.message ?? err)
    } catch {
      return 'a value that is not an Error was thrown'
    }
  }

  /** Answers a callback's or a host call's `call` with the error `err` that user code threw. */
  function rejectWith(call, err) {
    const code = err instanceof errors.ColocatedError ? err.code : null
    call.reject(describeError(err), typeof err?.stack === 'string' ? err.stack : null, code)
  }

  /** Bytes for the wire: a Buffer, a Uint8Array, or a string (UTF-8). */
  function bytesOf(data, what) {
    if (data === undefined || data === null) return Buffer.alloc(0)
    if (typeof data === 'string') return Buffer.from(data, 'utf8')
    if (data instanceof Uint8Array) return Buffer.from(data.buffer, data.byteOffset, data.byteLength)
    throw new errors.InvalidArgumentError(`${what} are bytes (a Buffer, a Uint8Array or a string)`)
  }

  const outsideProgram = (what) =>
    new errors.InvalidArgumentError(`${what} is for code that runs as a colocated function (on a host, during a call)`)

  /**
   * Calls host callback `index` of the running program (from code that runs
   * as a colocated function): resolves with its answer (a Buffer).
   */
  exports.callHost = function callHost(index, data) {
    const refused = signatures.mismatch('callHost', [index, data])
    if (refused !== null) return Promise.reject(refused)
    const running = current.getStore()
    if (running === undefined) return Promise.reject(outsideProgram('callHost'))
    return running.call.callHost(index, bytesOf(data, 'a host callback’s arguments'))
  }

  // The functions `hostCallback(fn)` wrapped: given by name, they take and
  // return values.
  const wrapped = new WeakMap()

  /**
   * A host callback: `fn` runs on this process's event loop whenever a
   * program on any host calls it (it may be async). Given by index
   * (`compile({hostCallbacks: [cb]})`, `specialize({hostCallbacks: [cb]})`)
   * it takes and returns bytes (`callHost(index, bytes)`); given by name
   * (`{hostCallbacks: {log: cb}}`) it takes and returns values
   * (`colocated.hostCallbacks.log(...)`).
   */
  exports.hostCallback = function hostCallback(fn, name) {
    signatures.check('hostCallback', [fn, name])
    const callback = new binding.HostCallback(name ?? (fn.name || 'host callback'), async (call) => {
      try {
        call.resolve(bytesOf(await fn(call.input), 'a host callback’s results'))
      } catch (err) {
        rejectWith(call, err)
      }
    })
    wrapped.set(callback, fn)
    return callback
  }

  /** The HostCallback that runs `fn` (a function, or `hostCallback(fn)`'s) with values, called `name`. */
  function valueCallback(fn, name) {
    const run = wrapped.get(fn) ?? fn
    if (typeof run !== 'function') {
      throw new errors.InvalidArgumentError(
        `hostCallbacks.${name} was not made by hostCallback(fn): give a function, or hostCallback(fn)`,
      )
    }
    const what = `host callback '${name}'`
    return new binding.HostCallback(name, async (call) => {
      try {
        const params = values.decode(call.input, what)
        const result = await run(...(Array.isArray(params) ? params : []))
        call.resolve(values.encode(result, what, 'its result'))
      } catch (err) {
        rejectWith(call, err)
      }
    })
  }

  /**
   * A colocated function's `hostCallbacks` option as its program's
   * callbacks (by index) and, for those given by name, their names.
   */
  function hostCallbacksOf(given) {
    if (given === undefined || given === null) return { callbacks: undefined, names: undefined }
    if (Array.isArray(given)) return { callbacks: given, names: undefined }
    const names = Object.keys(given)
    return { callbacks: names.map((name) => valueCallback(given[name], name)), names }
  }

  /** Calls host callback `name` of the running call `running` with `params`. */
  async function callByName(running, name, params) {
    const what = `host callback '${name}'`
    const index = running.names.indexOf(name)
    if (index < 0) {
      const known = running.names.length === 0 ? 'none' : running.names.join(', ')
      throw new errors.InvalidArgumentError(`${what} was not given to this function (its host callbacks: ${known})`)
    }
    const answer = await running.call.callHost(index, values.encode(params, what, 'arguments'))
    return values.decode(answer, what)
  }

  /**
   * The host callbacks given by name to the function that is running
   * (`colocated.hostCallbacks.log('hi', 3)`): each an async function of
   * values, resolving with what the controller's function returned.
   */
  // (Its target stays empty and extensible, so that its keys may be the
  // running function's.)
  exports.hostCallbacks = new Proxy(
    {},
    {
      get(_target, name) {
        // Not a thenable, and no symbol-keyed members (inspection).
        if (typeof name !== 'string' || name === 'then') return undefined
        const running = current.getStore()
        return async (...params) => {
          if (running === undefined) throw outsideProgram(`colocated.hostCallbacks.${name}`)
          return callByName(running, name, params)
        }
      },
      has(_target, name) {
        return typeof name === 'string' && (current.getStore()?.names.includes(name) ?? false)
      },
      ownKeys() {
        return [...(current.getStore()?.names ?? [])]
      },
      getOwnPropertyDescriptor(target, name) {
        if (!this.has(target, name)) return undefined
        return { value: this.get(target, name), enumerable: true, configurable: true, writable: false }
      },
      // Read-only.
      set: () => false,
      defineProperty: () => false,
      deleteProperty: () => false,
    },
  )

  /** Runs one host call (from an executor thread) on the event loop. */
  async function run(call) {
    try {
      const payload = JSON.parse(call.payload)
      let fn
      if (payload.object !== undefined) {
        const built = await hostObject(call, payload.object)
        if (built.error !== undefined) throw built.error
        const method = built.value[payload.method]
        if (typeof method !== 'function') {
          throw new errors.InvalidArgumentError(`the object has no method ${JSON.stringify(payload.method)}`)
        }
        fn = (...args) => method.apply(built.value, args)
      } else {
        fn = await load(call)
      }
      // The arguments' structure travels with the program (one per input spec).
      const inputs = unflatten(payload.args, call.inputs)
      const running = { call, names: payload.hostCallbacks ?? [] }
      // What the function calls runs on a stream of its own (core's rule
      // for host code that calls colocated functions, in every SDK).
      const result = await current.run(running, () => streams.context.run(call.stream, () => fn(...inputs)))
      const { leaves, skeleton } = flatten(result, 'a colocated function’s results')
      call.resolve(leaves, JSON.stringify(skeleton))
    } catch (err) {
      rejectWith(call, err)
    }
  }
  binding._setRunner(run, threadId)

  /**
   * What this thread hosts (functions of loaded programs, values it keeps for
   * core), and core's counts for the process (its registry of local values,
   * its host-object store): for diagnostics and tests.
   */
  const counts = () => ({ registered: binding._localValues(), objects: binding._hostObjects() })
  exports._hosted = () => ({ programs: loaded.size, values: held.size, ...counts() })

  // -- the controller -------------------------------------------------------

  const isDecoratorContext = (x, kind) => x !== null && typeof x === 'object' && x.kind === kind && 'name' in x

  /**
   * What a host needs to find `value`: its source (if it travels by it) and,
   * on this process, a reference to it in core's registry of local values
   * (this process's own host runs it by reference, as Python's SDK does,
   * which needs no source: a class a TypeScript decorator compiled is not
   * self-contained). The registration lives while the returned object does
   * (the colocated function or class holds it) or a program loaded from it;
   * then this thread lets go of `value`.
   */
  function describe(value, isClass = false) {
    const handle = new binding.LocalFunction(threadId)
    held.set(handle.id, { fn: value })
    let source = sourceOf(value)
    if (isClass && source !== null) {
      // Defining a class runs its static parts, which may refer to names
      // around it (a compiled decorator's do): then it does not travel.
      try {
        new Function('require', 'colocated', `return (${source})`)(require, exports)
      } catch {
        source = null
      }
    }
    // (Not enumerable: the payload's JSON leaves the handle out.)
    return Object.defineProperty({ source, local: handle.reference }, 'handle', { value: handle })
  }

  /**
   * `fn`'s source as an expression (a method's source, `name(x) {…}`,
   * `async name(x) {…}` or `*name() {…}`, becomes a function expression), or
   * null when it does not parse on its own.
   */
  function sourceOf(fn) {
    const source = fn.toString()
    const parses = (text) => {
      try {
        new Function(`return (${text})`)
        return true
      } catch {
        return false
      }
    }
    if (parses(source)) return source
    const method = /^(async\s+)?(\*\s*)?/.exec(source)
    const rest = source.slice(method[0].length)
    const asFunction = `${method[1] ?? ''}function${method[2] ? '*' : ''} ${rest}`
    if (parses(asFunction)) return asFunction
    // Not self-contained (it refers to names around it): this process runs it
    // by reference; other hosts cannot.
    return null
  }

  /** `ShapeDtypeStruct` of an array. */
  const specOf = (x) => new binding.ShapeDtypeStruct(x.shape, x.dtype, x.sharding)

  /**
   * Wraps `fn` (a self-contained function, or `{module, export}` naming a
   * module's export) to run on the hosts of its arguments' devices, with
   * each host's part of each argument. A call returns a Promise of the
   * result tree (arrays ready later, in program order). The first call of an
   * input spec discovers the outputs by running the function once per host;
   * `specialize({outSpecsFn})` declares them instead, `devices` lets calls
   * without arguments run.
   */
  function colocated(fn, options) {
    // Used as a standard decorator (`@colocated` on a method, often static):
    // the second argument is the decorator's context.
    if (isDecoratorContext(options, 'method')) options = {}
    signatures.check('colocated', [fn, options])
    options = options ?? {}
    let what
    let name
    if (typeof fn === 'function') {
      what = describe(fn)
      name = fn.name || 'colocated'
    } else if (fn !== null && typeof fn === 'object' && typeof fn.module === 'string') {
      what = { module: fn.module, export: fn.export ?? 'default' }
      name = `${fn.module}#${fn.export ?? 'default'}`
    } else {
      throw new errors.InvalidArgumentError('colocated() takes a function or {module, export}')
    }
    let inSpecs
    if (options.inSpecs !== undefined) {
      const specs = flatten(options.inSpecs, 'in specs', binding.ShapeDtypeStruct)
      inSpecs = { tree: structureOf(specs.skeleton), specs: specs.leaves }
    }
    const state = new FunctionState(name, options.devices ?? null, inSpecs)
    const call = caller(state, what, options, hostCallbacksOf(options.hostCallbacks), null)
    call.specialize = (more) => {
      signatures.check('specialize', [more])
      more = more ?? {}
      for (const key of ['inSpecs', 'outSpecsFn', 'devices', 'hostCallbacks']) {
        if (more[key] !== undefined && options[key] !== undefined) {
          throw new errors.InvalidArgumentError(`${key} already specified`)
        }
      }
      return colocated(fn, { ...options, ...more })
    }
    call.cacheInfo = () => {
      const [hits, misses, currsize] = state.cacheInfo()
      return { hits, misses, currsize }
    }
    return call
  }

  /**
   * The calls of `state` (a colocated function, or one method of one object:
   * `object` = {handle, payload}): flattening, the cache, program order.
   */
  function caller(state, what, options, hosted, object) {
    const handles = object === null ? null : [object.handle]

    const call = (...args) => {
      let leaves
      let skeleton
      try {
        ;({ leaves, skeleton } = flatten(args, 'colocated function arguments'))
      } catch (err) {
        return Promise.reject(err)
      }
      const tree = structureOf(skeleton)
      const stream = streams.current() ?? null
      const start = () => {
        const hit = state.callCached(tree, leaves, handles, stream ?? undefined)
        if (hit !== null) return finish(hit)
        let declared = null
        if (options.outSpecsFn) {
          const out = options.outSpecsFn(...unflatten(skeleton, leaves.map(specOf)))
          const specs = flatten(out, 'out specs', binding.ShapeDtypeStruct)
          declared = { specs: specs.leaves, structure: JSON.stringify(specs.skeleton) }
        }
        const payload = JSON.stringify({
          ...what,
          ...(object === null ? {} : object.payload),
          args: skeleton,
          hostCallbacks: hosted.names,
        })
        // (Absent fields are undefined: the binding reads null as an object.)
        const callOptions = {
          declared: declared ?? undefined,
          payload,
          objects: handles ?? undefined,
          callbacks: hosted.callbacks,
          stream: stream ?? undefined,
        }
        // Its place in the stream is held now; it compiles on libuv's pool
        // at once and runs in its place. A discovery runs the function
        // there before it returns: it takes a thread of the pool only once
        // the work queued before it ran.
        const pending = state.prepare(tree, leaves, callOptions)
        const run = pending.discovers ? pending.reached().then(() => pending.run()) : pending.run()
        return run.then(finish)
      }
      const finish = (result) => {
        // Failures show in the outputs; an unobserved `done` must not end the process.
        result.done?.catch(() => {})
        return unflatten(JSON.parse(result.structure), result.outputs)
      }
      try {
        return Promise.resolve(start())
      } catch (err) {
        return Promise.reject(errors.translate(err))
      }
    }
    return call
  }

  /**
   * Wraps a class (self-contained: it travels as its source; or {module,
   * export}) so that its instances live on the hosts of their methods'
   * arguments: built on each host by the first call there (with the
   * constructor's arguments, which must survive JSON), the same object for
   * later calls of any method, and destroyed on every host when the wrapper
   * is garbage-collected or disposed (`dispose()`, `using`): the host object's
   * `[Symbol.dispose]()` runs then. A constructor's error is thrown again by
   * every call. Methods are called like colocated functions.
   */
  function colocatedClass(Class, options) {
    // Used as a standard decorator (`@colocatedClass`).
    if (isDecoratorContext(options, 'class')) options = {}
    signatures.check('colocatedClass', [Class, options])
    options = options ?? {}
    let what
    let name
    if (typeof Class === 'function') {
      what = describe(Class, true)
      name = Class.name || 'ColocatedClass'
    } else if (Class !== null && typeof Class === 'object' && typeof Class.module === 'string') {
      what = { module: Class.module, export: Class.export ?? 'default' }
      name = `${Class.module}#${Class.export ?? 'default'}`
    } else {
      throw new errors.InvalidArgumentError('colocatedClass() takes a class or {module, export}')
    }
    const methods =
      typeof Class === 'function'
        ? Object.getOwnPropertyNames(Class.prototype).filter((m) => m !== 'constructor')
        : (options.methods ?? [])
    // Each method's host callbacks (its own options', else the class's).
    const hostedOf = new Map()
    const hostedFor = (method) => {
      let hosted = hostedOf.get(method)
      if (hosted === undefined) {
        hosted = hostCallbacksOf(options[method]?.hostCallbacks ?? options.hostCallbacks)
        hostedOf.set(method, hosted)
      }
      return hosted
    }
    const Wrapper = class {
      #handle = new binding.ObjectHandle()
      #args
      #calls = new Map()
      #disposed = false
      constructor(...args) {
        this.#args = JSON.parse(JSON.stringify(args))
      }
      _call(method, args) {
        let call = this.#calls.get(method)
        if (call === undefined) {
          const state = new FunctionState(`${name}.${method}`, options.devices ?? null, undefined)
          const payload = { object: { id: this.#handle.id, class: what, args: this.#args }, method }
          const methodOptions = { hostCallbacks: options.hostCallbacks, ...(options[method] ?? {}) }
          call = caller(state, {}, methodOptions, hostedFor(method), { handle: this.#handle, payload })
          this.#calls.set(method, call)
        }
        if (this.#disposed) {
          return Promise.reject(new errors.FailedPreconditionError(`object ${this.#handle.id} was disposed`))
        }
        return call(...args)
      }
      /**
       * Destroys the object on every host, after the calls made on it (those
       * that still compile too: they keep it); later calls fail.
       */
      dispose() {
        this.#disposed = true
        this.#handle.dispose()
      }
      [Symbol.dispose]() {
        this.dispose()
      }
    }
    Object.defineProperty(Wrapper, 'name', { value: name })
    for (const method of methods) {
      Object.defineProperty(Wrapper.prototype, method, {
        value: function (...args) {
          return this._call(method, args)
        },
        writable: true,
        configurable: true,
      })
    }
    return Wrapper
  }

  exports.colocated = colocated
  exports.colocatedClass = colocatedClass
}
