// The types the package's functions, constructors and option objects take,
// checked before a call reaches the native binding: a value of another type
// gets InvalidArgumentError naming the function, the argument (or option)
// and what it must be (`devicePut: options.dtype must be a string, not a
// number (3)`). The values themselves (a shape's sizes, a dtype's name, an
// axis the mesh lacks) are checked by the binding and core.

const binding = require('./binding.js')
const errors = require('./errors.js')

/** `value` for a message: its type, and a short value where that helps. */
function describe(value) {
  if (value === undefined) return 'undefined'
  if (value === null) return 'null'
  switch (typeof value) {
    case 'string':
      return `a string (${JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value)})`
    case 'number':
      return `a number (${value})`
    case 'bigint':
      return `a bigint (${value}n)`
    case 'boolean':
      return `a boolean (${value})`
    case 'symbol':
      return 'a symbol'
    case 'function':
      return 'a function'
  }
  if (Array.isArray(value)) return 'an array'
  const name = Object.getPrototypeOf(value) === null ? undefined : value.constructor?.name
  if (name === undefined || name === 'Object') return 'an object'
  return /^[AEIOU]/.test(name) ? `an ${name}` : `a ${name}`
}

// A type: what it is called in messages, and a check of a value at a path
// that returns the message of the first mismatch, or null.
function type(expected, test) {
  return {
    expected,
    check: (value, path) => (test(value) ? null : `${path} must be ${expected}, not ${describe(value)}`),
  }
}

/**
 * One of `types`. For an array or an object, the message is that of the
 * array's or the object's type among them (which names the item at fault).
 */
function anyOf(...types) {
  const names = types.map((t) => t.expected)
  const expected = names.length < 2 ? names[0] : `${names.slice(0, -1).join(', ')} or ${names.at(-1)}`
  return {
    expected,
    check: (value, path) => {
      let inner = null
      for (const t of types) {
        const mismatch = t.check(value, path)
        if (mismatch === null) return null
        if (t.shape !== undefined && t.shape === shapeOf(value)) inner = mismatch
      }
      return inner ?? `${path} must be ${expected}, not ${describe(value)}`
    },
  }
}

/** An array whose every item is `item` (`expected` names the whole). */
function arrayOf(item, expected) {
  return {
    expected,
    shape: 'array',
    check: (value, path) => {
      if (!Array.isArray(value)) return `${path} must be ${expected}, not ${describe(value)}`
      for (let i = 0; i < value.length; i++) {
        const mismatch = item.check(value[i], `${path}[${i}]`)
        if (mismatch !== null) return mismatch
      }
      return null
    },
  }
}

const isObject = (value) => value !== null && typeof value === 'object' && !Array.isArray(value)
/** 'array', 'object' (not an array), or undefined: which container types a value may be checked as. */
const shapeOf = (value) => (Array.isArray(value) ? 'array' : isObject(value) ? 'object' : undefined)

/** An options object: `fields` maps each option it checks to its type. */
function options(fields, expected = 'an object') {
  return {
    expected,
    shape: 'object',
    check: (value, path) => {
      if (!isObject(value)) return `${path} must be ${expected}, not ${describe(value)}`
      for (const [key, field] of Object.entries(fields)) {
        const mismatch = field.check(value[key], `${path}.${key}`)
        if (mismatch !== null) return mismatch
      }
      return null
    },
  }
}

/** An object whose every value is `item`. */
function recordOf(item, expected) {
  return {
    expected,
    shape: 'object',
    check: (value, path) => {
      if (!isObject(value)) return `${path} must be ${expected}, not ${describe(value)}`
      for (const [key, v] of Object.entries(value)) {
        const mismatch = item.check(v, `${path}.${key}`)
        if (mismatch !== null) return mismatch
      }
      return null
    },
  }
}

/** `t`, or undefined or null (absent). */
function optional(t) {
  return {
    expected: t.expected,
    shape: t.shape,
    check: (value, path) => (value === undefined || value === null ? null : t.check(value, path)),
  }
}

const instance = (name, Class = binding[name]) =>
  type(/^[AEIOU]/.test(name) ? `an ${name}` : `a ${name}`, (x) => x instanceof Class)

const string = type('a string', (x) => typeof x === 'string')
const number = type('a number', (x) => typeof x === 'number')
const boolean = type('a boolean', (x) => typeof x === 'boolean')
const func = type('a function', (x) => typeof x === 'function')
const bytes = type('a Buffer or a Uint8Array', (x) => x instanceof Uint8Array)
const device = instance('Device')
const devices = arrayOf(device, 'an array of Devices')
const sharding = anyOf(instance('NamedSharding'), instance('SingleDeviceSharding'), device)
const shape = arrayOf(number, 'an array of numbers')
const specs = arrayOf(instance('ShapeDtypeStruct'), 'an array of ShapeDtypeStructs')
const array = type('an Array', (x) => x instanceof binding.ColocatedArray)
const signal = instance('AbortSignal', AbortSignal)
const stream = instance('Stream')
const hostCallback = instance('HostCallback')
const hostCallbacks = arrayOf(hostCallback, 'an array of HostCallbacks')
const axisNames = arrayOf(string, 'an array of axis names (strings)')
const specEntry = anyOf(
  type('an axis name (a string)', (x) => typeof x === 'string'),
  axisNames,
  type('null', (x) => x === null),
)

/** A function or class a host imports: `{module, export}`. */
const byModule = options({ module: string, export: optional(string) }, '{module, export}')
/** Host callbacks of a colocated function: by index (bytes), or by name (values). */
const namedOrIndexed = optional(
  anyOf(hostCallbacks, recordOf(anyOf(func, hostCallback), 'an object of functions and HostCallbacks, by name')),
)
/** The options of a colocated function (`colocated(fn, options)`, `specialize(options)`). */
const colocatedOptions = options({
  inSpecs: optional(type('an array of ShapeDtypeStructs, one per argument', Array.isArray)),
  outSpecsFn: optional(func),
  devices: optional(devices),
  hostCallbacks: namedOrIndexed,
})

// Each function's parameters, `[name, type]` in order (`rest`: the type of
// each further argument). Classes without a constructor name where their
// objects come from.
const SIGNATURES = {
  // Constructors.
  Mesh: {
    params: [
      ['devices', type('an array of Devices (nested: one level per axis)', Array.isArray)],
      ['axisNames', axisNames],
    ],
  },
  NamedSharding: {
    params: [
      ['mesh', instance('Mesh')],
      ['spec', instance('PartitionSpec')],
    ],
  },
  PartitionSpec: { rest: ['entries', specEntry] },
  ShapeDtypeStruct: {
    params: [
      ['shape', shape],
      ['dtype', string],
      ['sharding', sharding],
    ],
  },
  SingleDeviceSharding: { params: [['device', device]] },
  HostCallback: {
    params: [
      ['name', string],
      ['run', func],
    ],
  },
  Client: { made: 'client() or connect()' },
  ColocatedArray: { made: 'devicePut() and the programs that return arrays' },
  Device: { made: 'devices() or a Client’s devices()' },
  LoadedExecutable: { made: 'compile() or deserializeAndLoad()' },
  Stream: { made: 'a Client’s createStream()' },

  // Functions.
  colocatedCpuDevices: { params: [['devices', devices]] },
  compile: {
    async: true,
    params: [
      [
        'program',
        options({
          name: optional(string),
          language: string,
          payload: anyOf(string, bytes),
          inSpecs: specs,
          outSpecs: specs,
          devices: optional(devices),
          hostCallbacks: optional(hostCallbacks),
        }),
      ],
    ],
  },
  compileStablehlo: {
    async: true,
    params: [
      ['module', anyOf(string, bytes)],
      ['devices', optional(devices)],
    ],
  },
  configure: {
    params: [
      [
        'options',
        options({
          numCpuDevices: optional(number),
          executorThreads: optional(number),
          pjrtPlugin: optional(string),
          pjrtOptions: optional(
            recordOf(
              anyOf(number, boolean, string, arrayOf(number, 'an array of integers')),
              'an object of numbers, booleans, strings or arrays of integers',
            ),
          ),
        }),
      ],
    ],
  },
  defaultBackend: { params: [] },
  devices: { params: [['backend', optional(string)]] },
  connect: {
    async: true,
    // connect(options) is connect(undefined, options).
    normalize: (addresses, options) => (isObject(addresses) ? [undefined, addresses] : [addresses, options]),
    params: [
      ['addresses', optional(anyOf(string, arrayOf(string, 'an array of addresses (strings)')))],
      [
        'options',
        optional(
          options({
            token: optional(string),
            tokenFile: optional(string),
            tlsCa: optional(anyOf(string, bytes)),
            tlsDomain: optional(string),
            includeLocal: optional(boolean),
            timeout: optional(number),
            default: optional(boolean),
            numCpuDevices: optional(number),
            cluster: optional(string),
            port: optional(number),
            service: optional(string),
            replicas: optional(number),
            namespace: optional(string),
            signal: optional(signal),
          }),
        ),
      ],
    ],
  },
  deserializeAndLoad: {
    async: true,
    params: [
      ['bytes', bytes],
      ['client', optional(instance('Client'))],
    ],
  },
  devicePut: {
    params: [
      [
        'data',
        type(
          'a typed array, a number, a bigint, a boolean, a string, an array of them or an Array',
          (x) =>
            ['number', 'bigint', 'boolean', 'string'].includes(typeof x) ||
            Array.isArray(x) ||
            ArrayBuffer.isView(x) ||
            x instanceof binding.ColocatedArray,
        ),
      ],
      ['sharding', optional(sharding)],
      [
        'options',
        optional(
          options({
            shape: optional(shape),
            dtype: optional(string),
            stream: optional(stream),
            onProgress: optional(func),
            signal: optional(signal),
          }),
        ),
      ],
    ],
  },
  makeArrayFromSingleDeviceArrays: {
    params: [
      ['shape', shape],
      ['sharding', sharding],
      ['arrays', arrayOf(array, 'an array of Arrays')],
    ],
  },
  P: { rest: ['entries', specEntry] },
  blockUntilReady: {
    async: true,
    params: [
      ['tree', type('anything', () => true)],
      ['options', optional(options({ signal: optional(signal) }))],
    ],
  },
  colocated: {
    params: [
      ['fn', anyOf(func, byModule)],
      ['options', optional(colocatedOptions)],
    ],
  },
  specialize: { params: [['options', optional(colocatedOptions)]] },
  colocatedClass: {
    params: [
      ['Class', anyOf(func, byModule)],
      [
        'options',
        optional(
          options({
            methods: optional(arrayOf(string, 'an array of method names (strings)')),
            devices: optional(devices),
            hostCallbacks: namedOrIndexed,
          }),
        ),
      ],
    ],
  },
  hostCallback: {
    params: [
      ['fn', func],
      ['name', optional(string)],
    ],
  },
  callHost: {
    async: true,
    params: [
      ['index', number],
      ['data', optional(anyOf(bytes, string))],
    ],
  },

  // Methods.
  'LoadedExecutable.execute': {
    params: [
      ['args', arrayOf(array, 'an array of Arrays')],
      ['options', optional(options({ signal: optional(signal), stream: optional(stream) }))],
    ],
  },
  'ColocatedArray.ready': { async: true, params: [['options', optional(options({ signal: optional(signal) }))]] },
  'ColocatedArray.toTypedArray': {
    async: true,
    params: [['options', optional(options({ signal: optional(signal) }))]],
  },
  'Client.loadPlugin': { params: [['path', string]] },
  'Client.devices': { params: [['backend', optional(string)]] },
  'Client.hostStats': { params: [['index', number]] },
  ...Object.fromEntries(
    ['on', 'once', 'off', 'addListener', 'removeListener'].map((method) => [
      `Client.${method}`,
      {
        params: [
          ['event', string],
          ['listener', func],
        ],
      },
    ]),
  ),
  'Stream.run': { params: [['fn', func]] },
}

/**
 * The InvalidArgumentError of the first of `args` that `name`'s signature
 * refuses, or null (also for a name without a signature).
 */
function mismatch(name, args) {
  if (!Object.hasOwn(SIGNATURES, name)) return null
  const signature = SIGNATURES[name]
  if (signature.made !== undefined) {
    return new errors.InvalidArgumentError(`${name} has no public constructor: its objects come from ${signature.made}`)
  }
  const params = signature.params ?? []
  if (signature.normalize !== undefined) args = signature.normalize(...args)
  for (let i = 0; i < params.length; i++) {
    const [param, t] = params[i]
    const found = t.check(args[i], param)
    if (found !== null) return new errors.InvalidArgumentError(`${name}: ${found}`)
  }
  if (signature.rest !== undefined) {
    const [param, t] = signature.rest
    for (let i = params.length; i < args.length; i++) {
      const found = t.check(args[i], `${param}[${i - params.length}]`)
      if (found !== null) return new errors.InvalidArgumentError(`${name}: ${found}`)
    }
  }
  return null
}

/** Throws the InvalidArgumentError of `mismatch(name, args)`, if any. */
function check(name, args) {
  const err = mismatch(name, args)
  if (err !== null) throw err
}

/** Whether `name` returns a Promise (its argument errors then reject it). */
const isAsync = (name) => Object.hasOwn(SIGNATURES, name) && SIGNATURES[name].async === true

module.exports = { check, mismatch, isAsync, describe, SIGNATURES }
