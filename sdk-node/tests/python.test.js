// Node drives Python code it did not write: a colocated Python program,
// compiled and serialized by the Python SDK, loaded by Node and run on Python
// workers.

const test = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')
const c = require('..')
const { pythonBin, startWorker, tokenFile, TMP } = require('./helpers.js')

// The Python controller: connects to the workers, compiles
// f(x) = (2x + 1, the pid of the process that ran it) for an int32[8]
// sharded over every device, and writes the executable's bytes.
const COMPILE = `
import os, sys
import numpy as np
import colocated
from colocated import Mesh, NamedSharding, P, ShapeDtypeStruct

out, token_file, *addresses = sys.argv[1:]
client = colocated.connect(addresses, token_file=token_file)
sharding = NamedSharding(Mesh(np.array(client.devices()), ("x",)), P("x"))

def f(x):
    return x * 2 + 1, x * 0 + os.getpid()

program = colocated.colocated_python(f).specialize(out_specs_fn=lambda x: (x, x))
with open(out, "wb") as file:
    file.write(program.compile(ShapeDtypeStruct((8,), np.int32, sharding)).serialize())
`

test('a Python program serialized by the Python SDK runs on Python workers from Node', {
  skip: pythonBin() === null && 'needs the Python SDK (make python)',
}, async () => {
  const token = tokenFile()
  const workers = await Promise.all([0, 1].map(() => startWorker({ devices: 2, token, python: true })))
  try {
    const addresses = workers.map((w) => w.address)
    const file = path.join(TMP, 'program.bin')
    execFileSync(pythonBin(), ['-c', COMPILE, file, token.file, ...addresses], { stdio: 'inherit' })
    const client = await c.connect(addresses, { tokenFile: token.file, default: false })
    const exe = await c.deserializeAndLoad(fs.readFileSync(file), client)
    const sharding = new c.NamedSharding(new c.Mesh(client.devices(), ['x']), c.P('x'))
    const x = c.devicePut(new Int32Array([0, 1, 2, 3, 4, 5, 6, 7]), sharding)
    const { outputs, done } = exe.execute([x])
    await done
    assert.deepEqual(Array.from(await outputs[0].toTypedArray()), [1, 3, 5, 7, 9, 11, 13, 15])
    // Each worker host ran it once, in a Python process of its own.
    const pids = Array.from(await outputs[1].toTypedArray())
    const perHost = [pids[0], pids[4]]
    assert.deepEqual(pids, [
      perHost[0],
      perHost[0],
      perHost[0],
      perHost[0],
      perHost[1],
      perHost[1],
      perHost[1],
      perHost[1],
    ])
    assert.notEqual(perHost[0], perHost[1])
    for (const pid of perHost) {
      assert.notEqual(pid, process.pid)
      assert.match(fs.readFileSync(`/proc/${pid}/cmdline`, 'latin1'), /python/)
    }
    client.close()
  } finally {
    await Promise.all(workers.map((w) => w.stop()))
  }
})
