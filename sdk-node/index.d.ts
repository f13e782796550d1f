// Types of the npm package `colocated`. The classes and functions of the
// native binding are generated from the Rust crate (binding.d.ts); this file
// adds what index.js defines: the error classes, `P`, `blockUntilReady`, and
// `Array` as the name of `ColocatedArray` (as JAX's `jax.Array`).

import type { ColocatedArray, Device, Host, HostCallback, PartitionSpec, Stream, TypedArray } from './binding'

export type {
  ConfigureOptions,
  ConnectOptions,
  Execution,
  Host,
  HostStats,
  ProgramOptions,
  PutOptions,
  Shard,
  ShardingOptions,
  TypedArray,
} from './binding'
export {
  Client,
  ColocatedArray,
  ColocatedArray as Array,
  client,
  colocatedCpuDevices,
  compile,
  compileStablehlo,
  configure,
  connect,
  Device,
  defaultBackend,
  deserializeAndLoad,
  devicePut,
  devices,
  HostCallback,
  LoadedExecutable,
  localDevices,
  Mesh,
  makeArrayFromSingleDeviceArrays,
  NamedSharding,
  PartitionSpec,
  ShapeDtypeStruct,
  SingleDeviceSharding,
} from './binding'

declare module './binding' {
  interface ColocatedArray {
    /** Resolves once ready; `signal` aborts the wait (CancelledError, or DeadlineExceededError for AbortSignal.timeout). */
    ready(options?: { signal?: AbortSignal }): Promise<void>
    /** Gathers the array; `signal` aborts the wait. */
    toTypedArray(options?: { signal?: AbortSignal }): Promise<TypedArray | string[]>
  }
  interface PutOptions {
    /** Deletes the array when it aborts (a wait for it then rejects with CancelledError). */
    signal?: AbortSignal
  }
  interface ConnectOptions {
    /** Aborts the wait for the connection. */
    signal?: AbortSignal
  }
  /** Connects to the workers `options.cluster` finds (as `connect(null, options)`). */
  function connect(options: ConnectOptions): Promise<Client>
  interface LoadedExecutable {
    /**
     * `signal` aborts the wait of `done` (the execution goes on); `stream`
     * (default: the calling context's, see `Stream.run`) orders it.
     */
    execute(args: Array<ColocatedArray>, options?: { signal?: AbortSignal; stream?: Stream }): Execution
  }
  interface Stream {
    /** Runs `fn` with this stream as the stream of every call it makes (across its awaits). */
    run<T>(fn: () => T): T
  }
  interface Client {
    /**
     * Host events: what happens to the client's workers, told on the event
     * loop in the order it happened. Listeners keep nothing alive.
     * - `'hostDisconnected'` (host, error): the link to the worker broke;
     *   the client connects again by itself for as long as the worker keeps
     *   the session, and work there waits.
     * - `'hostReconnected'` (host): the link came back and the session
     *   resumed: nothing was lost.
     * - `'hostLost'` (host, error): the worker's session is lost for good
     *   (it restarted, or the link stayed down past its session timeout:
     *   `UnavailableError`; or `close()` ended it: `CancelledError`); what
     *   the session held fails with that error. Once per lost session, and
     *   at once to the first listener for a session lost already.
     * - `'hostReopened'` (host): new work opened a new session with the
     *   worker after one was lost.
     */
    on(event: HostErrorEvent, listener: (host: Host, error: ColocatedError) => void): this
    on(event: HostEvent, listener: (host: Host) => void): this
    once(event: HostErrorEvent, listener: (host: Host, error: ColocatedError) => void): this
    once(event: HostEvent, listener: (host: Host) => void): this
    off(event: HostErrorEvent, listener: (host: Host, error: ColocatedError) => void): this
    off(event: HostEvent, listener: (host: Host) => void): this
    addListener(event: HostErrorEvent, listener: (host: Host, error: ColocatedError) => void): this
    addListener(event: HostEvent, listener: (host: Host) => void): this
    removeListener(event: HostErrorEvent, listener: (host: Host, error: ColocatedError) => void): this
    removeListener(event: HostEvent, listener: (host: Host) => void): this
  }
}

/** The host events of a Client that carry an error (see `Client.on`). */
export type HostErrorEvent = 'hostDisconnected' | 'hostLost'
/** The host events of a Client without an error (see `Client.on`). */
export type HostEvent = 'hostReconnected' | 'hostReopened'

/** A partition spec: `P('x', null)`, `P(['x', 'y'])`. */
export declare function P(...entries: (string | string[] | null)[]): PartitionSpec

/**
 * Resolves with `tree` once every array in it (nested in arrays and plain
 * objects) is ready; rejects with the first error.
 */
export declare function blockUntilReady<T>(tree: T, options?: { signal?: AbortSignal }): Promise<T>

/**
 * The host callbacks of a colocated function: by index (an array: each
 * takes and returns bytes, `callHost(index, bytes)` calls it), or by name
 * (an object of functions or `hostCallback(fn)`s: each is an async function
 * of values inside the function, `colocated.hostCallbacks.name(...)`).
 */
export type HostCallbacksOption = HostCallback[] | Record<string, HostCallback | ((...args: never[]) => unknown)>

/** The options of a colocated function (`colocated(fn, options)`, `specialize(options)`). */
export interface ColocatedOptions {
  /** The arguments' specs every call must match (an array of them, as the arguments). */
  inSpecs?: unknown[]
  /** The arguments' specs to the result's `ShapeDtypeStruct`s: the outputs are declared, not discovered. */
  outSpecsFn?: (...specs: unknown[]) => unknown
  /** Lets calls without arguments run, on these devices. */
  devices?: Device[]
  /** Controller functions the function may call (see `HostCallbacksOption`). */
  hostCallbacks?: HostCallbacksOption
}

/** A function that runs on the hosts of its arguments' devices (see `colocated`). */
export interface ColocatedFunction<Args extends unknown[], Result> {
  /** Runs it with each host's part of each argument; resolves with the result tree (arrays ready later). */
  (...args: Args): Promise<Result>
  /**
   * A copy that declares its outputs (`outSpecsFn`: the arguments' specs to the
   * result's `ShapeDtypeStruct`s; no discovery run) and/or runs without
   * arguments on `devices`. Specifying a field twice throws InvalidArgumentError.
   */
  specialize(options?: ColocatedOptions): ColocatedFunction<Args, Result>
  /** Hits, misses and size of the cache of compiled programs per input spec. */
  cacheInfo(): { hits: number; misses: number; currsize: number }
}

/**
 * Wraps a self-contained function (it travels as its source; inside it,
 * `colocated` and `require` are available) or `{module, export}` (the host
 * imports it) to run on the hosts that own its arguments' devices, with each
 * host's part of each argument: this process, or Node workers
 * (`npx colocated worker`). It may be async, and returns arrays, or arrays
 * and plain objects of them. The first call of an input spec discovers the
 * outputs by running it once per host.
 */
export declare function colocated<Args extends ColocatedArray[], Result>(
  fn: (...args: Args) => Result | Promise<Result>,
  options?: ColocatedOptions,
): ColocatedFunction<Args, Awaited<Result>>
export declare function colocated(
  fn: { module: string; export?: string },
  options?: ColocatedOptions,
): ColocatedFunction<ColocatedArray[], unknown>
/**
 * `@colocated` on a method (often static), a TypeScript 5 / ECMAScript
 * standard decorator: the method runs as a colocated function. (A decorator
 * cannot change the method's type: it returns a Promise now.)
 */
export declare function colocated<This, Args extends unknown[], Result>(
  method: (this: This, ...args: Args) => Result,
  context: ClassMethodDecoratorContext<This, (this: This, ...args: Args) => Result>,
): (this: This, ...args: Args) => Result

/**
 * Wraps a class (self-contained, or `{module, export}` with `methods`) whose
 * instances live on the hosts of their methods' arguments: built on each host
 * by the first call there (constructor arguments must survive JSON), the same
 * object for later calls, destroyed on every host when the wrapper is
 * garbage-collected or disposed (`dispose()`, `using`; the host object's
 * `[Symbol.dispose]()` runs). A constructor's error is thrown again by every
 * call. Each method returns a Promise, as a colocated function does.
 */
export declare function colocatedClass<Args extends unknown[], Instance>(
  Class: new (...args: Args) => Instance,
  options?: { devices?: Device[]; hostCallbacks?: HostCallbacksOption },
): new (
  ...args: Args
) => {
  [K in keyof Instance]: Instance[K] extends (...a: infer A) => infer R ? (...a: A) => Promise<Awaited<R>> : never
} & {
  dispose(): void
  [Symbol.dispose](): void
}
/**
 * `@colocatedClass`, a TypeScript 5 / ECMAScript standard decorator: the
 * class's instances live on the hosts of their methods' arguments. (A
 * decorator cannot change the class's type: its methods return Promises now,
 * and instances have `dispose()`.)
 */
export declare function colocatedClass<C extends abstract new (...args: never[]) => unknown>(
  Class: C,
  context: ClassDecoratorContext<C>,
): C
export declare function colocatedClass(
  Class: { module: string; export?: string },
  options: { methods: string[]; devices?: Device[]; hostCallbacks?: HostCallbacksOption },
): new (
  ...args: unknown[]
) => Record<string, (...args: ColocatedArray[]) => Promise<unknown>> & { dispose(): void }

/**
 * What a host callback given by name takes and returns: JSON values
 * (objects with `toJSON()` as JSON sends them), and `undefined`, NaN and
 * ±Infinity, bigints, typed arrays and Buffers, which arrive as they were
 * sent; in arrays and plain objects. Anything else (a function, a Map, a
 * class instance, a colocated Array, a cycle) is refused with
 * `InvalidArgumentError`.
 */
export type HostValue =
  | null
  | undefined
  | boolean
  | number
  | bigint
  | string
  | TypedArray
  | Buffer
  | { toJSON(): unknown }
  | readonly HostValue[]
  | { readonly [key: string]: HostValue }

/**
 * The host callbacks given by name to the colocated function that is
 * running: `await colocated.hostCallbacks.log('hi', 3)` calls the
 * controller's `log` with those values, wherever the function runs, and
 * resolves with what it returned. Declare yours for their types:
 * `declare module 'colocated' { interface HostCallbacks { log(msg: string, n: number): Promise<void> } }`.
 */
export interface HostCallbacks {
  [name: string]: HostCallbackFunction
}
/**
 * A host callback by name, as the function calls it. (A method's type, so
 * that declarations with narrower parameters fit `HostCallbacks`.)
 */
export type HostCallbackFunction = { call(...args: HostValue[]): Promise<unknown> }['call']

/**
 * The running colocated function's host callbacks by name (see
 * `HostCallbacks`). A call rejects with `InvalidArgumentError` outside a
 * colocated function, for a name the function was not given, or for a value
 * that cannot be sent; with the callback's error when it throws.
 */
export declare const hostCallbacks: HostCallbacks

/**
 * A host callback: `fn` runs on this process's event loop whenever a program
 * on any host calls it (it may be async). Given by index
 * (`compile({hostCallbacks: [cb]})`, `specialize({hostCallbacks: [cb]})`), it
 * takes and returns bytes (`callHost(index, bytes)`); given by name
 * (`{hostCallbacks: {log: cb}}`), it takes and returns values (`HostValue`).
 */
export declare function hostCallback(
  fn: (input: Buffer) => Uint8Array | string | undefined | Promise<Uint8Array | string | undefined>,
  name?: string,
): HostCallback
export declare function hostCallback<Args extends HostValue[]>(
  fn: (...args: Args) => HostValue | Promise<HostValue> | void | Promise<void>,
  name?: string,
): HostCallback

/** Calls host callback `index` of the running program (bytes in, bytes out), from code that runs as a colocated function. */
export declare function callHost(index: number, data?: Uint8Array | string): Promise<Buffer>

/** The canonical error codes (core's, as in the Python SDK). */
export type ErrorCode =
  | 'cancelled'
  | 'invalid_argument'
  | 'deadline_exceeded'
  | 'not_found'
  | 'already_exists'
  | 'permission_denied'
  | 'resource_exhausted'
  | 'failed_precondition'
  | 'unimplemented'
  | 'internal'
  | 'unavailable'
  | 'unauthenticated'

/** Every error of colocated: a canonical `code` and, for user code that failed on a host, its stack there. */
export declare class ColocatedError extends Error {
  constructor(message: string, options?: { code?: ErrorCode; remoteStack?: string | null; cause?: unknown })
  /** The canonical code. */
  readonly code: ErrorCode
  /** The stack (traceback) user code left on the host where it failed, or null. */
  readonly remoteStack: string | null
}
export declare class CancelledError extends ColocatedError {}
export declare class InvalidArgumentError extends ColocatedError {}
export declare class DeadlineExceededError extends ColocatedError {}
export declare class NotFoundError extends ColocatedError {}
export declare class AlreadyExistsError extends ColocatedError {}
export declare class PermissionDeniedError extends ColocatedError {}
export declare class ResourceExhaustedError extends ColocatedError {}
export declare class FailedPreconditionError extends ColocatedError {}
export declare class UnimplementedError extends ColocatedError {}
export declare class InternalError extends ColocatedError {}
export declare class UnavailableError extends ColocatedError {}
export declare class UnauthenticatedError extends ColocatedError {}
