// The stream of the calling asynchronous context: `stream.run(fn)` makes
// `stream` the stream of every call `fn` makes, across its awaits; outside
// any, calls queue on the event loop's own stream.
const { AsyncLocalStorage } = require('node:async_hooks')

const context = new AsyncLocalStorage()

/** The current context's stream, or undefined (the event loop's). */
const current = () => context.getStore()

module.exports = { context, current }
