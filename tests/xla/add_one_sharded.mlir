module @jit_add_one attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=4]>
  func.func public @main(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) -> (tensor<8xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{"x"}]>}) {
    %c = stablehlo.constant dense<1.0> : tensor<8xf32>
    %0 = stablehlo.add %arg0, %c : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
