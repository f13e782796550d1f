// Type-checks the package's declarations as a TypeScript user sees them
// (`tsc --noEmit`, run by `make test-node`); it is not executed.
import * as c from 'colocated'

async function main(): Promise<void> {
  c.configure({ numCpuDevices: 4 })
  const devices: c.Device[] = c.devices()
  const mesh = new c.Mesh(devices, ['x'])
  const sharding = new c.NamedSharding(mesh, c.P('x'))
  const x: c.Array = c.devicePut(new Float32Array(8), sharding, { dtype: 'float32' })
  const shape: number[] = x.shape
  const data = await x.toTypedArray()
  const spec = new c.ShapeDtypeStruct(shape, x.dtype, sharding)
  const exe: c.LoadedExecutable = await c.compile({
    language: 'native',
    payload: 'f',
    inSpecs: [spec],
    outSpecs: [spec],
  })
  const run: c.Execution = exe.execute([x])
  await run.done
  await c.blockUntilReady({ out: run.outputs })
  const addOne = c
    .colocated(async (a: c.Array) => c.devicePut(await a.toTypedArray(), a.sharding))
    .specialize({ outSpecsFn: (s) => s })
  const y: c.Array = await addOne(x)
  void y
  void addOne.cacheInfo().hits
  class Acc {
    total = 0
    add(a: c.Array): c.Array {
      return a
    }
  }
  const Remote = c.colocatedClass(Acc)
  const acc = new Remote()
  const added: c.Array = await acc.add(x)
  acc.dispose()
  void added
  const remote: c.Client = await c.connect(['127.0.0.1:1'], { token: 't', timeout: 1000, default: false })
  remote.on('hostLost', (host, error) => {
    const index: number = host.index
    const code: c.ErrorCode = error.code
    void [index, code]
  })
  remote.once('hostDisconnected', (host, error) => void [host.name, error.code])
  remote.on('hostReconnected', (host) => void host.index)
  remote.off('hostReopened', (host) => void host.index)
  const stats: c.HostStats = remote.hostStats(0)
  const counts: number[] = [stats.disconnects, stats.reconnects, stats.sessionsLost, stats.sessionsReopened]
  void counts
  remote.close()
  try {
    c.devicePut([1])
  } catch (e) {
    if (e instanceof c.ColocatedError) {
      const code: c.ErrorCode = e.code
      void code
    }
  }
  void data

  // PartitionSpec takes its entries as arguments.
  const spec2: c.PartitionSpec = new c.PartitionSpec('x', null, ['y', 'z'])
  void spec2

  // Host callbacks by name: async functions of values inside the function.
  const log = c.hostCallback(async (msg: string, n: number) => ({ msg, twice: n * 2 }))
  const logged = c
    .colocated(
      async (a: c.Array) => {
        const answer = await c.hostCallbacks.log('hi', 3)
        const twice: number = answer.twice
        const other: unknown = await c.hostCallbacks.other(1n, new Float32Array(2), { nested: [null, undefined] })
        void [twice, other]
        return a
      },
      { hostCallbacks: { log, quiet: () => {} } },
    )
    .specialize({ outSpecsFn: (s) => s })
  const z: c.Array = await logged(x)
  void z
  // By index: bytes in, bytes out.
  const bytes = c.hostCallback((input) => input.subarray(1))
  c.colocated((a: c.Array) => a).specialize({ hostCallbacks: [bytes] })
  const answer: Buffer = await c.callHost(0, 'x')
  void answer
  // @ts-expect-error: a host callback is a function
  c.colocated((a: c.Array) => a, { hostCallbacks: { log: 3 } })
  // @ts-expect-error: log takes a string and a number
  void c.hostCallbacks.log(() => 1)
}

// The types of this program's host callbacks by name.
declare module 'colocated' {
  interface HostCallbacks {
    log(msg: string, n: number): Promise<{ msg: string; twice: number }>
  }
}

void main
