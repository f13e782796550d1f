// `npx colocated worker` and tracing: it never writes the file of
// COLOCATED_TRACE (the controller's), and writes its own trace when told to
// with `--trace FILE` (each session worker its own, NAME.PID.EXT beside it).
// A real worker process on 127.0.0.1.

const test = require('node:test')
const assert = require('node:assert/strict')
const { spawn } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const c = require('..')
const { tokenFile } = require('./helpers.js')

test('a Node worker told to trace writes its own files and never the controller’s', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'colocated-trace-'))
  const own = path.join(dir, 'worker.json')
  const controllers = path.join(dir, 'controller.json')
  const token = tokenFile()
  const bin = path.join(__dirname, '..', 'bin', 'colocated.js')
  const args = ['worker', '--listen', '127.0.0.1:0', '--cpu-devices', '1', '--token-file', token.file, '--trace', own]
  const env = { ...process.env, COLOCATED_TRACE: controllers, COLOCATED_LOG: 'error' }
  const child = spawn(process.execPath, [bin, ...args], { stdio: ['pipe', 'pipe', 'inherit'], env })
  const exited = new Promise((done) => child.once('exit', done))
  try {
    const address = await new Promise((resolve, reject) => {
      let out = ''
      child.once('exit', (code) => reject(new Error(`worker exited with ${code}: ${out}`)))
      child.stdout.on('data', (chunk) => {
        out += chunk
        const match = /^listening on (\S+)$/m.exec(out)
        if (match) resolve(match[1])
      })
    })
    const client = await c.connect(address, { tokenFile: token.file, default: false })
    const x = c.devicePut(new Int32Array([1, 2]), client.devices()[0])
    assert.deepEqual(Array.from(await x.toTypedArray()), [1, 2])
    client.close()
  } finally {
    child.kill('SIGTERM')
    await exited
  }
  assert.equal(fs.existsSync(controllers), false, 'the worker opened COLOCATED_TRACE’s file')
  // The supervisor's file, and its session worker's beside it (NAME.PID.EXT).
  assert.notEqual(JSON.parse(fs.readFileSync(own, 'utf8')), null)
  const sessions = fs.readdirSync(dir).filter((name) => /^worker\.\d+\.json$/.test(name))
  assert.equal(sessions.length, 1, String(fs.readdirSync(dir)))
  const events = JSON.parse(fs.readFileSync(path.join(dir, sessions[0]), 'utf8'))
  const names = events.filter((e) => e.ph === 'M' && e.name === 'process_name').map((e) => e.args.name)
  assert.deepEqual(names, ['worker (this process)'])
  assert.ok(
    events.some((e) => e.ph === 'X'),
    JSON.stringify(events),
  )
  fs.rmSync(dir, { recursive: true, force: true })
})
