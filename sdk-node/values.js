// Values of host callbacks called by name (`colocated.hostCallbacks.log(…)`)
// as the bytes that core's host callbacks carry: JSON text, in which the
// values JSON cannot hold (undefined, NaN and ±Infinity, bigints, typed
// arrays and Buffers) are objects tagged with the key `$colocated` (an object
// of the caller's own with that key is tagged too). Pure type translation:
// core carries the bytes, orders and places the calls.

const errors = require('./errors.js')

const TAG = '$colocated'
const MAX_DEPTH = 256

// The typed arrays that travel with their element type (and Buffer, which
// arrives as a Buffer).
const TYPED = {
  Buffer,
  Int8Array,
  Uint8Array,
  Uint8ClampedArray,
  Int16Array,
  Uint16Array,
  Int32Array,
  Uint32Array,
  Float32Array,
  Float64Array,
  BigInt64Array,
  BigUint64Array,
}

const SENDABLE = 'JSON values, undefined, bigints, typed arrays and Buffers, in arrays and plain objects'

/** `what` with an article: `a Map`, `an Array`. */
function named(value) {
  const name = value?.constructor?.name
  if (typeof name !== 'string' || name === '') return 'an object without a prototype chain it can name'
  return /^[AEIOU]/.test(name) ? `an ${name}` : `a ${name}`
}

function refuse(what, path, reason) {
  return new errors.InvalidArgumentError(
    `${what}: ${path} cannot be sent: ${reason} (a host callback takes ${SENDABLE})`,
  )
}

/** The type name of a typed array `TYPED` knows, or null. */
function typedName(value) {
  if (Buffer.isBuffer(value)) return 'Buffer'
  if (!ArrayBuffer.isView(value) || value instanceof DataView) return null
  const name = value.constructor?.name
  return TYPED[name] === value.constructor ? name : null
}

function isPlain(value) {
  const proto = Object.getPrototypeOf(value)
  return proto === Object.prototype || proto === null
}

/**
 * `value` as bytes (UTF-8 JSON). Throws InvalidArgumentError naming `what`
 * and the path of the first value that cannot be sent (a function, a
 * symbol, a cycle, an object other than a plain object, an array or one with
 * `toJSON()`, such as a Map or a colocated Array).
 */
function encode(value, what, root) {
  const ancestors = new Set()
  const walk = (x, path, depth) => {
    if (x === null || typeof x === 'boolean' || typeof x === 'string') return x
    if (x === undefined) return { [TAG]: 'undefined' }
    if (typeof x === 'number') return Number.isFinite(x) ? x : { [TAG]: 'number', value: String(x) }
    if (typeof x === 'bigint') return { [TAG]: 'bigint', value: x.toString() }
    if (typeof x === 'function') throw refuse(what, path, 'a function')
    if (typeof x === 'symbol') throw refuse(what, path, 'a symbol')
    if (depth > MAX_DEPTH) throw refuse(what, path, `it nests deeper than ${MAX_DEPTH}`)
    const typed = typedName(x)
    if (typed !== null) {
      const bytes = Buffer.from(x.buffer, x.byteOffset, x.byteLength)
      return { [TAG]: typed, base64: bytes.toString('base64') }
    }
    if (ancestors.has(x)) throw refuse(what, path, 'it contains itself (a cycle)')
    ancestors.add(x)
    try {
      if (Array.isArray(x)) return x.map((item, i) => walk(item, `${path}[${i}]`, depth + 1))
      if (typeof x.toJSON === 'function') return walk(x.toJSON(), path, depth + 1)
      if (!isPlain(x)) {
        const hint =
          x.constructor?.name === 'ColocatedArray' ? ' (send `await x.toTypedArray()`, its data, instead)' : ''
        throw refuse(what, path, `${named(x)}${hint}`)
      }
      const out = {}
      for (const [key, item] of Object.entries(x)) out[key] = walk(item, `${path}.${key}`, depth + 1)
      // An object of the caller's own with the tag key is tagged itself.
      return Object.hasOwn(x, TAG) ? { [TAG]: 'object', entries: Object.entries(out) } : out
    } finally {
      ancestors.delete(x)
    }
  }
  return Buffer.from(JSON.stringify(walk(value, root, 0)), 'utf8')
}

/** The value of bytes made by `encode`; InvalidArgumentError naming `what` for others. */
function decode(bytes, what) {
  const malformed = (detail) =>
    new errors.InvalidArgumentError(`${what}: the bytes are not values of a host callback (${detail})`)
  let parsed
  try {
    parsed = JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('utf8'))
  } catch (err) {
    throw malformed(err.message)
  }
  const walk = (x) => {
    if (x === null || typeof x !== 'object') return x
    if (Array.isArray(x)) return x.map(walk)
    if (!Object.hasOwn(x, TAG)) {
      const out = {}
      for (const [key, item] of Object.entries(x)) out[key] = walk(item)
      return out
    }
    const tag = x[TAG]
    if (tag === 'undefined') return undefined
    if (tag === 'number' && ['NaN', 'Infinity', '-Infinity'].includes(x.value)) return Number(x.value)
    if (tag === 'bigint' && typeof x.value === 'string') return BigInt(x.value)
    if (tag === 'object' && Array.isArray(x.entries)) {
      return Object.fromEntries(x.entries.map(([key, item]) => [key, walk(item)]))
    }
    if (Object.hasOwn(TYPED, tag) && typeof x.base64 === 'string') {
      const data = Buffer.from(x.base64, 'base64')
      if (tag === 'Buffer') return data
      const Typed = TYPED[tag]
      if (data.byteLength % Typed.BYTES_PER_ELEMENT !== 0) throw malformed(`${tag} of ${data.byteLength} bytes`)
      // A copy of its own, aligned for the element type.
      const buffer = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength)
      return new Typed(buffer)
    }
    throw malformed(`unknown ${JSON.stringify(TAG)} value ${JSON.stringify(tag)}`)
  }
  try {
    return walk(parsed)
  } catch (err) {
    if (err instanceof errors.ColocatedError) throw err
    throw malformed(err.message)
  }
}

module.exports = { encode, decode, SENDABLE }
