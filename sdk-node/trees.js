// The trees of a colocated call: its arguments and results are arrays (the
// leaves), and arrays and plain objects of them. An object's leaves go in
// sorted key order, as JAX's pytrees sort a dict's keys (core's rule for
// every SDK), and a structure's canonical text sorts its keys too, so that
// key order makes no other structure.

const errors = require('./errors.js')

/**
 * The leaves (instances of `Leaf`) of `tree` in order, and its skeleton: 0 for a leaf,
 * an array or a plain object of skeletons, null for null/undefined. An
 * object's leaves go in sorted key order (core's rule for every SDK, as
 * JAX's pytrees sort a dict's keys), its skeleton keeps its own key order:
 * `{a, b}` and `{b, a}` are one structure (see `structureOf`), with the
 * same leaves in the same order.
 */
function flatten(tree, what, Leaf) {
  const leaves = []
  const walk = (x) => {
    if (x instanceof Leaf) {
      leaves.push(x)
      return 0
    }
    if (x === null || x === undefined) return null
    if (Array.isArray(x)) return x.map(walk)
    if (typeof x === 'object' && Object.getPrototypeOf(x) === Object.prototype) {
      return inKeyOrder(x, (k) => walk(x[k]))
    }
    throw new errors.InvalidArgumentError(
      `${what} are arrays (and arrays and plain objects of them), not ${typeof x === 'object' ? x.constructor?.name : typeof x}`,
    )
  }
  return { leaves, skeleton: walk(tree) }
}

/**
 * An object with the keys of `object` in its order (or sorted), the value
 * of each `value(key)`, called in sorted key order (the order of the leaves).
 */
function inKeyOrder(object, value, sortedOrder = false) {
  const keys = Object.keys(object)
  const out = Object.fromEntries((sortedOrder ? keys.sort() : keys).map((k) => [k, null]))
  for (const k of keys.sort()) out[k] = value(k)
  return out
}

/** The tree of `skeleton` with `leaves` in order (an object's in sorted key order, as `flatten` took them). */
function unflatten(skeleton, leaves) {
  let at = 0
  const build = (s) => {
    if (s === 0) return leaves[at++]
    if (s === null) return null
    if (Array.isArray(s)) return s.map(build)
    return inKeyOrder(s, (k) => build(s[k]))
  }
  return build(skeleton)
}

/**
 * What core keys a call's structure by (its tree key): nothing for
 * positional arrays alone (core's flat key), else the skeleton's canonical
 * JSON text (objects' keys sorted, so that key order makes no other
 * structure).
 */
const structureOf = (skeleton) =>
  Array.isArray(skeleton) && skeleton.every((s) => s === 0) ? undefined : JSON.stringify(skeleton, sortedKeys)
const sortedKeys = (_key, v) =>
  v === null || typeof v !== 'object' || Array.isArray(v) ? v : inKeyOrder(v, (k) => v[k], true)

module.exports = { flatten, unflatten, structureOf }
