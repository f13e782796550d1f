// Standard (TypeScript 5) decorators: compiled by `tsc -p tsconfig.decorators.json`
// into tests/ts-out/ and run by `node --test` (make test-node).
import assert from 'node:assert/strict'
import test from 'node:test'
import * as c from 'colocated'

// A decorated class is not self-contained once compiled (the decorator's
// helpers surround it): this process runs it by reference, with its scope.
// A decorated static method travels by its source, where `colocated` is the
// package.
declare const colocated: typeof c

c.configure({ numCpuDevices: 2 })

@c.colocatedClass
class Tally {
  total = 0
  async add(x: c.Array): Promise<c.Array> {
    const data = (await x.toTypedArray()) as Float32Array
    this.total += data.reduce((a, b) => a + b, 0)
    return c.devicePut(
      data.map(() => this.total),
      x.sharding,
    )
  }
}

// biome-ignore lint/complexity/noStaticOnlyClass: decorators need a class
class Jobs {
  @c.colocated
  static async double(x: c.Array): Promise<c.Array> {
    const data = (await x.toTypedArray()) as Float32Array
    return colocated.devicePut(
      data.map((v) => v * 2),
      x.sharding,
    )
  }
}

test('a decorated class keeps its object on the host; a decorated method runs there', async () => {
  const x = c.devicePut(new Float32Array([1, 2]), c.devices()[1])
  const tally = new Tally()
  await tally.add(x)
  const second = await tally.add(x)
  assert.deepEqual(Array.from((await second.toTypedArray()) as Float32Array), [6, 6])
  const doubled = await Jobs.double(x)
  assert.deepEqual(Array.from((await doubled.toTypedArray()) as Float32Array), [2, 4])
  ;(tally as unknown as { dispose(): void }).dispose()
})
