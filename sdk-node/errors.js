// The error classes of colocated: `ColocatedError` and one subclass per
// canonical code (core's, as in the Python SDK). The native addon builds
// instances through `fromCore`; `translate` turns an argument error of the
// binding layer (a wrong type, a foreign object) into `InvalidArgumentError`.

class ColocatedError extends Error {
  /**
   * @param {string} message
   * @param {{code?: string, remoteStack?: string | null}} [options]
   */
  constructor(message, options = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause })
    this.name = new.target.name
    /** The canonical code (`'invalid_argument'`, `'unavailable'`, …). */
    this.code = options.code ?? 'unknown'
    /** For user code that failed on a host: the stack (traceback) it left there. */
    this.remoteStack = options.remoteStack ?? null
  }
}

const CODES = {
  cancelled: 'CancelledError',
  invalid_argument: 'InvalidArgumentError',
  deadline_exceeded: 'DeadlineExceededError',
  not_found: 'NotFoundError',
  already_exists: 'AlreadyExistsError',
  permission_denied: 'PermissionDeniedError',
  resource_exhausted: 'ResourceExhaustedError',
  failed_precondition: 'FailedPreconditionError',
  unimplemented: 'UnimplementedError',
  internal: 'InternalError',
  unavailable: 'UnavailableError',
  unauthenticated: 'UnauthenticatedError',
}

const classes = { ColocatedError }
const byCode = new Map()
for (const [code, name] of Object.entries(CODES)) {
  // A named class per code, so that stacks and `instanceof` read naturally.
  const cls = {
    [name]: class extends ColocatedError {
      constructor(message, options = {}) {
        super(message, { ...options, code })
      }
    },
  }[name]
  classes[name] = cls
  byCode.set(code, cls)
}

/** The error of a core error (called by the addon). */
function fromCore([code, message, remoteStack]) {
  const cls = byCode.get(code) ?? ColocatedError
  return new cls(message, { code, remoteStack })
}

// Statuses the binding layer gives a value it cannot convert.
const ARGUMENT_STATUSES = new Set([
  'InvalidArg',
  'ObjectExpected',
  'StringExpected',
  'NameExpected',
  'FunctionExpected',
  'NumberExpected',
  'BooleanExpected',
  'ArrayExpected',
  'BigintExpected',
  'DateExpected',
  'ArrayBufferExpected',
  'DetachableArraybufferExpected',
])

/**
 * `err` as a ColocatedError when the binding layer refused an argument of
 * `where` (a function's name) that `arguments.js` let through.
 */
function translate(err, where = 'colocated') {
  if (err instanceof ColocatedError || !(err instanceof Error)) return err
  if (ARGUMENT_STATUSES.has(err.code)) {
    return new classes.InvalidArgumentError(`${where}: an argument has a type it does not take (${err.message})`, {
      cause: err,
    })
  }
  return err
}

module.exports = { ...classes, fromCore, translate }
