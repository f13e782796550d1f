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
}

void main
