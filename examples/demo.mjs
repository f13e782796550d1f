// The Node SDK: a controller with local devices, then two Node worker
// processes on loopback (`colocated worker` of the npm package) that run a
// native function of a plugin and a JavaScript function. Run by `make demo`
// (after `make node`), with the example plugin's path in COLOCATED_PLUGIN.
import { spawn } from 'node:child_process'
import crypto from 'node:crypto'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import * as colocated from '../sdk-node/index.mjs'

colocated.configure({ numCpuDevices: 4 })

// Local: an array sharded over this process's four devices, and back.
const local = new colocated.Mesh(colocated.devices(), ['x'])
const x = colocated.devicePut(
  [
    [1, 2],
    [3, 4],
    [5, 6],
    [7, 8],
  ],
  new colocated.NamedSharding(local, colocated.P('x')),
  { dtype: 'int32' },
)
for (const shard of x.addressableShards) {
  console.log(`${shard.device}: rows ${shard.index[0].join('..')} = ${Array.from(await shard.data.toTypedArray())}`)
}
try {
  colocated.devicePut(new Float32Array(3), null, { shape: [2, 2] })
} catch (err) {
  console.log(`bad input: ${err.name} (${err.code}): ${err.message}`)
}

// Two workers, with a token only this run knows.
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'colocated-demo-'))
const tokenFile = path.join(dir, 'token')
fs.writeFileSync(tokenFile, crypto.randomBytes(24).toString('hex'), { mode: 0o600 })
const workers = await Promise.all(
  [0, 1].map(
    () =>
      new Promise((resolve, reject) => {
        const args = ['worker', '--listen', '127.0.0.1:0', '--cpu-devices', '2', '--token-file', tokenFile]
        // The example plugin (the tests' plugin) checks at load that the
        // loader refuses bad registrations; the loader's warnings of those
        // are not news here.
        const env = { ...process.env, COLOCATED_LOG: 'warn,colocated_plugin=error' }
        const bin = new URL('../sdk-node/bin/colocated.js', import.meta.url).pathname
        const child = spawn(process.execPath, [bin, ...args, '--plugin', process.env.COLOCATED_PLUGIN], {
          stdio: ['ignore', 'pipe', 'inherit'],
          env,
        })
        child.stdout.once('data', (line) => {
          const match = /^listening on (\S+)/.exec(String(line))
          if (!match) return reject(new Error(`a worker did not start: ${line}`))
          console.log(`worker pid ${child.pid}: ${String(line).trim()}`)
          resolve({ child, address: match[1] })
        })
      }),
  ),
)
const client = await colocated.connect(
  workers.map((w) => w.address),
  { tokenFile },
)
console.log(`connected: ${client.hosts().map((h) => `${h.name} (devices ${h.deviceIds})`)}`)

// An array over both hosts; a native program runs once per host on its shards.
const sharding = new colocated.NamedSharding(new colocated.Mesh(client.devices(), ['x']), colocated.P('x'))
const spec = new colocated.ShapeDtypeStruct([8], 'int32', sharding)
const addOne = await colocated.compile({
  language: 'native',
  payload: 'plugin_add_one_i32',
  inSpecs: [spec],
  outSpecs: [spec],
})
const input = colocated.devicePut(new Int32Array([0, 10, 20, 30, 40, 50, 60, 70]), sharding)
const { outputs, done } = addOne.execute([input])
await done
for (const shard of outputs[0].addressableShards) {
  console.log(`process ${shard.device.processIndex} ${shard.device}: ${Array.from(await shard.data.toTypedArray())}`)
}
console.log(`gathered: ${Array.from(await outputs[0].toTypedArray())}`)

// A JavaScript function, once per host with that host's part of the array.
const onHosts = colocated.colocated(async (x) => {
  const mine = await x.toTypedArray()
  return colocated.devicePut(
    mine.map((v) => v * 10 + process.pid * 1000),
    x.sharding,
  )
})
const tagged = await onHosts(outputs[0])
for (const shard of tagged.addressableShards) {
  const values = Array.from(await shard.data.toTypedArray())
  console.log(
    `JavaScript on process ${shard.device.processIndex}: pid ${Math.floor(values[0] / 1000)}, got ${values.map((v) => (v % 1000) / 10)}`,
  )
}

client.close()
for (const { child } of workers) {
  const exited = new Promise((resolve) => child.once('exit', resolve))
  child.kill('SIGTERM')
  console.log(`worker pid ${child.pid} exited with ${await exited}`)
}
fs.rmSync(dir, { recursive: true })
