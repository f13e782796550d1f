module @add_one {
  func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {
    %c = stablehlo.constant dense<1.0> : tensor<8xf32>
    %0 = stablehlo.add %arg0, %c : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}
